import gzip
import hashlib

import numpy as np
import pytest

from convsweep.inputs import data
from convsweep.inputs.data import DATASETS, batch_indices, load_dataset, read_idx, upscale_bilinear
from convsweep.base.errors import ConfigError, DataError
from convsweep.base.fileio import SealedCache


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path, array, *, gz=False, type_code=0x08):
    raw = idx_bytes(array, type_code)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


@pytest.fixture
def tiny_set(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (6, 5, 5), dtype=np.uint8)
    labels = np.array([0, 1, 2, 0, 1, 2], dtype=np.uint8)
    return (
        write_idx(tmp_path / "imgs.idx", images, gz=True),
        write_idx(tmp_path / "lbls.idx", labels),
        images,
        labels,
    )


def test_vendored_mnist5k_files():
    images = read_idx(DATASETS["mnist5k"].images)
    labels = read_idx(DATASETS["mnist5k"].labels)
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (5000,)
    assert np.bincount(labels).tolist() == [500] * 10
    assert np.all(np.diff(labels.astype(int)) >= 0)  # sorted by label, as the README says
    assert hashlib.sha256(DATASETS["mnist5k"].images.read_bytes()).hexdigest().startswith("48e13f85")


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_gz_and_raw(tmp_path, gz):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    # The name says nothing about compression: detection is by magic bytes.
    path = write_idx(tmp_path / "anything.bin", array, gz=gz)
    out = read_idx(path)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, array)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.gz: no such file"):
        read_idx(tmp_path / "nope.gz")


def test_read_idx_wrong_type_byte(tmp_path):
    path = write_idx(tmp_path / "float.idx", np.zeros((2, 2)), type_code=0x0D)
    with pytest.raises(DataError, match=r"float\.idx: IDX type byte 0x0d but expected 0x08"):
        read_idx(path)


def test_read_idx_not_idx(tmp_path):
    path = tmp_path / "text.idx"
    path.write_bytes(b"hello world")
    with pytest.raises(DataError, match=r"text\.idx: .*not an IDX file"):
        read_idx(path)


def test_read_idx_truncated_payload(tmp_path):
    path = tmp_path / "short.idx.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((3, 4, 4)))[:-5]))
    with pytest.raises(DataError, match=r"short\.idx\.gz: IDX payload is 43 bytes but dims 3x4x4 need 48"):
        read_idx(path)


def test_read_idx_truncated_header(tmp_path):
    path = tmp_path / "head.idx"
    path.write_bytes(idx_bytes(np.zeros((3, 4, 4)))[:9])
    with pytest.raises(DataError, match=r"head\.idx: IDX header incomplete: 9 bytes, expected 16"):
        read_idx(path)


def test_read_idx_wrong_dim_count(tmp_path):
    path = write_idx(tmp_path / "labels.idx", np.zeros(7))
    with pytest.raises(DataError, match=r"labels\.idx: IDX magic 2049 \(labels\) but expected 2051 \(images\)"):
        read_idx(path, ndim=3)


def test_read_idx_corrupt_gzip(tmp_path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((4, 4))))[:-12])
    with pytest.raises(DataError, match=r"bad\.gz: corrupt gzip"):
        read_idx(path)


def test_upscale_hand_computed_2x2_to_4x4():
    image = np.array([[[0, 255], [255, 0]]], dtype=np.uint8)
    # align_corners=False, scale 1/2: output centres sample at -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1).
    weights = np.array([[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    expected = weights @ np.array([[0.0, 1.0], [1.0, 0.0]]) @ weights.T
    out = upscale_bilinear(image, 4)
    assert out.dtype == np.float32 and out.shape == (1, 4, 4)
    np.testing.assert_allclose(out[0], expected, atol=1e-6)
    assert out[0, 1, 1] == pytest.approx(0.375)


def test_upscale_keeps_constant_images_constant():
    images = np.stack([np.full((28, 28), v, dtype=np.uint8) for v in (0, 77, 255)])
    out = upscale_bilinear(images, 86)
    for out_image, value in zip(out, (0, 77, 255)):
        np.testing.assert_allclose(out_image, value / 255, atol=1e-6)
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_load_dataset_explicit_files(tiny_set, tmp_path):
    images_path, labels_path, images, labels = tiny_set
    ds = load_dataset("fashion-tiny", images=images_path, labels=labels_path, image_size=9, cache_dir=tmp_path / "c")
    assert ds.name == "fashion-tiny"
    assert ds.images.shape == (6, 1, 9, 9) and ds.images.dtype == np.float32
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == labels.tolist()
    assert ds.source == (str(images_path), str(labels_path))
    assert ds.sha256 == hashlib.sha256(images_path.read_bytes() + labels_path.read_bytes()).hexdigest()
    np.testing.assert_allclose(ds.images[:, 0], upscale_bilinear(images, 9))


def test_load_dataset_native_size_skips_upscale(tiny_set, tmp_path):
    images_path, labels_path, images, _ = tiny_set
    ds = load_dataset("t", images=images_path, labels=labels_path, image_size=5, cache_dir=tmp_path / "c")
    np.testing.assert_allclose(ds.images[:, 0], images / 255, atol=1e-7)


def test_load_dataset_count_mismatch(tmp_path):
    images = write_idx(tmp_path / "i.idx", np.zeros((4, 3, 3)))
    labels = write_idx(tmp_path / "l.idx", np.zeros(3))
    with pytest.raises(DataError, match=r"l\.idx: 3 labels but expected 4"):
        load_dataset("x", images=images, labels=labels, cache_dir=tmp_path)


def test_load_dataset_swapped_files(tiny_set, tmp_path):
    images_path, labels_path, _, _ = tiny_set
    with pytest.raises(DataError, match=r"lbls\.idx: IDX magic 2049 \(labels\) but expected 2051"):
        load_dataset("x", images=labels_path, labels=images_path, cache_dir=tmp_path)


def test_load_dataset_unknown_name():
    with pytest.raises(ConfigError, match=r"dataset 'fashion': expected one of mnist5k"):
        load_dataset("fashion")


def test_cache_is_reused(tiny_set, tmp_path, monkeypatch):
    images_path, labels_path, _, _ = tiny_set
    cache = tmp_path / "cache"
    first = load_dataset("t", images=images_path, labels=labels_path, image_size=12, cache_dir=cache)
    [cached] = cache.glob("*.sealed")
    assert first.sha256 in cached.name and "12" in cached.name

    def fail(*args):
        raise AssertionError("recomputed despite a valid cache")

    monkeypatch.setattr(data, "upscale_bilinear", fail)
    second = load_dataset("t", images=images_path, labels=labels_path, image_size=12, cache_dir=cache)
    np.testing.assert_array_equal(first.images, second.images)


def test_cache_dir_from_environment(tiny_set, tmp_path, monkeypatch):
    images_path, labels_path, _, _ = tiny_set
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "envcache"))
    load_dataset("t", images=images_path, labels=labels_path, image_size=7)
    assert len(list((tmp_path / "envcache").glob("*.sealed"))) == 1


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_run(tiny_set, tmp_path):
    images_path, labels_path, images, _ = tiny_set
    (tmp_path / "a-file").write_text("")
    with pytest.warns(UserWarning, match="cannot write the image cache"):
        ds = load_dataset("t", images=images_path, labels=labels_path, image_size=12,
                          cache_dir=tmp_path / "a-file" / "c")
    np.testing.assert_allclose(ds.images[:, 0], upscale_bilinear(images, 12))


def sealed_as(array):
    """An entry sealed with the directory's own secret, as a bug of this user's would write it: the
    seal holds, so only the shape and dtype that data.py asks for can refuse it."""
    def write(path):
        key = path.name.removesuffix(".sealed")
        SealedCache(path.parent).write_array(path.name, key, {}, array)
    return write


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda p: p.write_bytes(b"garbage"),
        lambda p: p.write_bytes(p.read_bytes()[:-40]),
        sealed_as(np.zeros((6, 12, 11), np.float32)),
        sealed_as(np.zeros((6, 12, 12), np.float64)),
    ],
    ids=["garbage", "truncated", "shape", "dtype"],
)
def test_corrupt_cache_is_recomputed(tiny_set, tmp_path, corrupt):
    """(Every way an entry can be tampered with, for every cache: tests/test_caches.py.)"""
    images_path, labels_path, images, _ = tiny_set
    cache = tmp_path / "cache"
    load_dataset("t", images=images_path, labels=labels_path, image_size=12, cache_dir=cache)
    [cached] = cache.glob("*.sealed")
    corrupt(cached)
    again = load_dataset("t", images=images_path, labels=labels_path, image_size=12, cache_dir=cache)
    np.testing.assert_allclose(again.images[:, 0], upscale_bilinear(images, 12))
    assert SealedCache(cache).read_array(cached.name, cached.name.removesuffix(".sealed")).shape == (6, 12, 12)
    assert not list(cache.glob(".*.tmp"))


def test_batch_indices_cycles_through_small_sets():
    idx = batch_indices(7, 20)
    assert len(idx) == 20
    assert sorted(idx[:7].tolist()) == list(range(7))
    np.testing.assert_array_equal(idx[7:14], idx[:7])
    np.testing.assert_array_equal(batch_indices(7, 20), idx)


def test_batch_indices_mix_classes_of_a_sorted_set():
    labels = np.repeat(np.arange(10), 500)
    counts = np.bincount(labels[batch_indices(5000, 100)], minlength=10)
    assert (counts > 0).all() and counts.max() < 25
    assert sorted(batch_indices(5000, 5000).tolist()) == list(range(5000))


def test_batch_indices_rejects_empty():
    with pytest.raises(ConfigError, match="batch: expected a positive integer"):
        batch_indices(10, 0)
    with pytest.raises(DataError, match="empty"):
        batch_indices(0, 10)


def test_check_dataset_knows_the_names_and_looks_for_the_files(tiny_set):
    from convsweep.inputs.data import check_dataset

    check_dataset("mnist5k")
    check_dataset("random")
    images, labels = tiny_set[:2]
    check_dataset({"name": "tiny", "images": str(images), "labels": str(labels)})
    with pytest.raises(ConfigError, match=r"^unknown dataset 'fashion'; expected one of mnist5k, random, or IDX files"):
        check_dataset("fashion")
    with pytest.raises(ConfigError, match=r"^labels: no such file '.*nope\.idx'$"):
        check_dataset({"name": "tiny", "images": str(images), "labels": str(labels.parent / "nope.idx")})
