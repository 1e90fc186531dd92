"""What a run computes on and is checked against: a batch of real (or seeded random) images, the
network's weights, and the float64 reference logits of every image, cached on disk."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .data import Dataset, batch_indices, load_dataset, random_dataset
from .fileio import canonical_hash, write_npy_atomic
from .network import Network, load_weights, reference_forward
from .paths import cache_dir


@dataclass(frozen=True)
class Batch:
    """What a run computes on: `idx` picks the batch's images (and labels) from the dataset, which
    the network runs with `weights`; `reference` is the float64 truth for exactly those images."""

    network: Network
    dataset: Dataset
    weights: dict[str, np.ndarray]
    idx: np.ndarray

    @cached_property
    def images(self) -> np.ndarray:
        return np.ascontiguousarray(self.dataset.images[self.idx], dtype=self.network.dtype)

    @cached_property
    def reference(self) -> np.ndarray:
        return reference_logits(self.network, self.dataset, self.weights)[self.idx]


def load_batch(network: Network, dataset_spec: str | dict, batch: int) -> Batch:
    """`batch` images of a named or IDX-file dataset (cycled when it has fewer), or of `random`
    (exactly the batch: those workloads are large per image), with the network's weights."""
    size = network.input_shape[-1]
    if dataset_spec == "random":
        dataset = random_dataset(network.input_shape, batch)
    elif isinstance(dataset_spec, dict):
        dataset = load_dataset(dataset_spec["name"], images=dataset_spec["images"], labels=dataset_spec["labels"],
                               image_size=size)
    else:
        dataset = load_dataset(dataset_spec, image_size=size)
    return Batch(network, dataset, load_weights(network), batch_indices(len(dataset.images), batch))


def reference_logits(network: Network, dataset: Dataset, weights: dict[str, np.ndarray]) -> np.ndarray:
    """float64 logits of every image of the dataset, cached: the truth every run is checked against."""
    weights_hash = hashlib.sha256(b"".join(k.encode() + v.tobytes() for k, v in sorted(weights.items()))).hexdigest()
    key = canonical_hash([dataset.sha256, weights_hash, Path(network.path).read_text(), list(network.input_shape)])
    path = cache_dir() / "reference" / f"{key}.npy"
    try:
        cached = np.load(path)
        if cached.shape[0] == len(dataset.images):
            return cached
    except (OSError, ValueError):
        pass
    logits = reference_forward(network, {k: v.astype(np.float64) for k, v in weights.items()},
                               dataset.images.astype(np.float64), dtype=np.float64)
    write_npy_atomic(path, logits)
    return logits
