"""Images for inference: IDX files (MNIST, Fashion-MNIST), upscaled to the network's input and cached."""

from __future__ import annotations

import gzip
import hashlib
import os
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from convsweep.base.fileio import SealedCache
from convsweep.model.layers import bilinear_matrix
from convsweep.base.paths import cache_dir as default_cache_dir
from convsweep.base.errors import ConfigError, DataError
from convsweep.base.paths import DATA_DIR


IDX_UINT8 = 0x08
_IDX_KINDS = {1: "labels", 3: "images"}


@dataclass(frozen=True)
class DatasetFiles:
    """The two IDX files of a named dataset."""

    images: Path
    labels: Path


DATASETS: dict[str, DatasetFiles] = {
    "mnist5k": DatasetFiles(
        images=DATA_DIR / "mnist5k-images-idx3-ubyte.gz",
        labels=DATA_DIR / "mnist5k-labels-idx1-ubyte.gz",
    ),
}


@dataclass(frozen=True)
class Dataset:
    """Images ready for a network (float32 [N, C, H, W] in [0, 1]) and their labels (None for
    synthetic inputs, which are checked against the reference but have no accuracy)."""

    name: str
    images: np.ndarray
    labels: np.ndarray | None
    source: tuple[str, ...]
    sha256: str
    raw: np.ndarray | None = None  # the stored uint8 images [N, h, w] the float ones were made from (IDX files)


RANDOM = "random"


def check_dataset(spec: str | dict) -> None:
    """What the planner can tell of a job's dataset before any job runs: a name must be one convsweep
    knows (or `random`), and IDX files given by path must be there. ConfigError otherwise."""
    if isinstance(spec, dict):
        for key in ("images", "labels"):
            if not Path(spec[key]).is_file():
                raise ConfigError(f"{key}: no such file {str(spec[key])!r}")
    elif spec != RANDOM and spec not in DATASETS:
        raise ConfigError(f"unknown dataset {spec!r}; expected one of {', '.join([*sorted(DATASETS), RANDOM])}, "
                          "or IDX files as {name, images, labels}")


def random_dataset(shape: tuple[int, ...], count: int, seed: int = 0) -> Dataset:
    """`count` seeded uniform images of `shape` [C, H, W]: inputs for workloads timed for speed."""
    rng = np.random.default_rng(seed)
    images = rng.random((count, *shape), dtype=np.float32)
    sha256 = hashlib.sha256(repr((RANDOM, tuple(shape), count, seed)).encode()).hexdigest()
    return Dataset(name=RANDOM, images=images, labels=None, source=(RANDOM,), sha256=sha256)


def _idx_kind(ndim: int) -> str:
    return _IDX_KINDS.get(ndim, f"{ndim}-d")


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return path.read_bytes()


def _decode_idx(path: Path, raw: bytes, ndim: int | None) -> np.ndarray:
    # Gzip is recognised by its magic bytes so a renamed or uncompressed copy still loads.
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: corrupt gzip stream ({exc})") from None
    if len(raw) < 4:
        raise DataError(f"{path}: IDX header incomplete: {len(raw)} bytes, expected at least 4")
    magic = int.from_bytes(raw[:4], "big")
    zero, type_code, dims_count = raw[:2], raw[2], raw[3]
    if zero != b"\x00\x00":
        raise DataError(f"{path}: IDX magic {magic:#010x} does not start with two zero bytes; not an IDX file")
    if type_code != IDX_UINT8:
        raise DataError(f"{path}: IDX type byte {type_code:#04x} but expected 0x08 (uint8)")
    if ndim is not None and dims_count != ndim:
        raise DataError(
            f"{path}: IDX magic {magic} ({_idx_kind(dims_count)}) "
            f"but expected {0x0800 + ndim} ({_idx_kind(ndim)})"
        )
    header_size = 4 + 4 * dims_count
    if len(raw) < header_size:
        raise DataError(
            f"{path}: IDX header incomplete: {len(raw)} bytes, expected {header_size} for {dims_count} dims"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims_count))
    expected = int(np.prod(shape, dtype=np.int64))
    actual = len(raw) - header_size
    if actual != expected:
        dims = "x".join(map(str, shape))
        raise DataError(f"{path}: IDX payload is {actual} bytes but dims {dims} need {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(shape).copy()


def read_idx(path: str | os.PathLike, *, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (gzipped or raw) into a uint8 array; `ndim` guards against swapped files."""
    path = Path(path)
    return _decode_idx(path, _read_bytes(path), ndim)


def upscale_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """Upscale uint8 [N, h, w] to float32 [N, size, size] in [0, 1], like torch's bilinear with align_corners=False."""
    if images.ndim != 3:
        raise DataError(f"upscale_bilinear: expected images [N, h, w], got shape {images.shape}")
    _, h, w = images.shape
    rows = _interpolation_matrix(h, size)
    cols = _interpolation_matrix(w, size)
    scaled = images.astype(np.float32) / np.float32(255.0)
    out = rows @ (scaled @ cols.T)
    return np.clip(out, 0.0, 1.0, out=out)


def _interpolation_matrix(n_in: int, n_out: int) -> np.ndarray:
    return bilinear_matrix(n_in, n_out).astype(np.float32)


def _upscaled(raw_images: np.ndarray, size: int, sha256: str, cache_dir: Path) -> np.ndarray:
    """The images upscaled to `size`, from the cache where its entry is sound (fileio.SealedCache: sealed
    under the IDX files' digest and the size, with the array's digest), or computed and kept there."""
    shape, key = (raw_images.shape[0], size, size), f"idx-{sha256}-bilinear{size}"
    cache, name = SealedCache(cache_dir), f"{key}.sealed"
    cached = cache.read_array(name, key)
    if cached is not None and cached.shape == shape and cached.dtype == np.float32:
        return cached
    upscaled = upscale_bilinear(raw_images, size)
    try:
        cache.write_array(name, key, {"images": list(raw_images.shape)}, upscaled)
    except OSError as exc:  # the cache is an optimization: a directory we cannot write costs a warning, not the run
        warnings.warn(f"{cache_dir}: cannot write the image cache ({exc}); continuing without it", stacklevel=2)
    return upscaled


def load_dataset(
    name: str,
    *,
    images: str | os.PathLike | None = None,
    labels: str | os.PathLike | None = None,
    image_size: int = 86,
    cache_dir: str | os.PathLike | None = None,
) -> Dataset:
    """Load a named dataset, or any pair of IDX files given as `images` and `labels`."""
    if (images is None) != (labels is None):
        raise ConfigError(f"dataset {name!r}: give both images and labels paths, or neither")
    if images is not None:
        assert labels is not None  # both or neither, above
        files = DatasetFiles(Path(images), Path(labels))
    elif name in DATASETS:
        files = DATASETS[name]
    else:
        known = ", ".join(sorted(DATASETS))
        raise ConfigError(f"dataset {name!r}: expected one of {known}, or explicit images/labels IDX paths")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise ConfigError(f"dataset {name!r}: image_size: expected a positive integer, got {image_size!r}")

    image_bytes = _read_bytes(files.images)
    label_bytes = _read_bytes(files.labels)
    raw_images = _decode_idx(files.images, image_bytes, ndim=3)
    raw_labels = _decode_idx(files.labels, label_bytes, ndim=1)
    if raw_images.shape[0] != raw_labels.shape[0]:
        raise DataError(
            f"{files.labels}: {raw_labels.shape[0]} labels but expected {raw_images.shape[0]}, "
            f"one per image in {files.images}"
        )
    digest = hashlib.sha256()
    digest.update(image_bytes)
    digest.update(label_bytes)
    sha256 = digest.hexdigest()

    if raw_images.shape[1:] == (image_size, image_size):
        pixels = raw_images.astype(np.float32) / np.float32(255.0)
    else:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        pixels = _upscaled(raw_images, image_size, sha256, cache)
    return Dataset(
        name=name,
        images=pixels[:, None, :, :],
        labels=raw_labels.astype(np.int64),
        source=(str(files.images), str(files.labels)),
        sha256=sha256,
        raw=raw_images,
    )


def batch_indices(n_available: int, batch: int) -> np.ndarray:
    """Indices of `batch` images drawn from a set of `n_available`, cycling when the batch is larger.

    The vendored sets are sorted by label, so the first 100 images are all zeros; a fixed
    seeded permutation gives every batch a class mix while keeping runs reproducible.
    """
    if n_available <= 0:
        raise DataError(f"batch_indices: the dataset is empty (n_available={n_available})")
    if batch <= 0:
        raise ConfigError(f"batch: expected a positive integer, got {batch!r}")
    return shuffled(n_available)[np.arange(batch) % n_available]


def shuffled(n_available: int) -> np.ndarray:
    """The fixed seeded order batches take a dataset's images in (batch_indices)."""
    return np.random.default_rng(0).permutation(n_available)
