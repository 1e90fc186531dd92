"""Rounds no kernel has seen (convsweep.device.rounds) on the CPU: kernels/truth.cu's perturb_* built for the host and
run on the fake GPU. A round keeps the data's character (blank stays blank, values in range, digits still
classified as their labels), never holds an image twice, is the same bit for bit from the same seed and
another from another, and is visibly new against every earlier sighting of its images; the ledger that
judges it is held to a brute-force numpy answer."""
from __future__ import annotations

import numpy as np
import pytest

from convsweep.model.checks import TOLERANCE
from convsweep.inputs.data import batch_indices
from convsweep.inputs.batch import load_batch
from convsweep.model.network import load_network, reference_forward
from convsweep.device.rounds import (FRESH_SHARE, FRESH_THRESHOLD, PERTURBATION, SOURCE_PERTURBATION, Ledger, RoundMaker,
                              _occurrence, draw_seed, fresh_share, round_sources)
from convsweep.device.truth import TruthKernels

from fake_gpu import FakeGpu, FakeStream
from host_kernels import compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++) to build kernels/truth.cu for the host")

LENET = load_network("networks/lenet86.yaml")


@pytest.fixture(scope="module")
def kernels():
    return TruthKernels(FakeGpu(), "sm_90")


def made(kernels, shipped: np.ndarray, batch: int, seed: int, rounds, perturbation=PERTURBATION) -> list[np.ndarray]:
    """Rounds `rounds` of `batch` images from the dataset `shipped`, made on the fake GPU, as host arrays."""
    gpu, stream = kernels.gpu, FakeStream()
    maker = RoundMaker(kernels, shipped, batch, seed, stream, perturbation)
    out = gpu.alloc((batch, *shipped.shape[1:]), shipped.dtype)
    found = []
    for r in rounds:
        assert np.array_equal(maker.make(r, out, stream), round_sources(len(shipped), batch, r))
        found.append(gpu.read(out).copy())
    return found


def test_round_zero_is_the_seeds_batch_and_later_rounds_carry_on_through_the_order():
    assert np.array_equal(round_sources(5000, 300, 0), batch_indices(5000, 300))
    assert np.array_equal(round_sources(5000, 300, 2), batch_indices(5000, 900)[600:])
    assert np.array_equal(round_sources(5000, 10000, 1), batch_indices(5000, 20000)[10000:])


@pytest.mark.parametrize("input_format", ["fp32", "fp16", "u8", "u8-source"])
def test_a_round_keeps_blank_blank_and_values_in_range(kernels, input_format):
    batch = load_batch(LENET, "mnist5k", 40, input_format)
    (images,) = made(kernels, batch.shipped, 40, 7, [1])
    source = batch.shipped[round_sources(len(batch.shipped), 40, 1)]
    assert images.dtype == batch.shipped.dtype and images.shape == source.shape
    values = images.astype(np.float64) / (255.0 if images.dtype == np.uint8 else 1.0)
    assert values.min() >= 0.0 and values.max() <= 1.0
    # a digit on a blank background: most of the image is exactly zero, as in the dataset, and the ink moved
    assert abs(np.mean(values == 0) - np.mean(source == 0)) < 0.05
    assert not np.array_equal(images, source)


def test_the_same_seed_makes_the_same_round_and_another_seed_another(kernels):
    shipped = load_batch(LENET, "mnist5k", 1, "u8-source").shipped
    a1, a2 = made(kernels, shipped, 50, 11, [3, 4])
    (b1,) = made(kernels, shipped, 50, 11, [3])
    (c1,) = made(kernels, shipped, 50, 12, [3])
    assert np.array_equal(a1, b1) and not np.array_equal(a1, c1) and not np.array_equal(a1, a2)
    assert draw_seed() != draw_seed()


def test_a_round_never_holds_an_image_twice_even_past_the_dataset(kernels):
    shipped = load_batch(LENET, "mnist5k", 1, "u8-source").shipped  # 5000 stored digits
    (images,) = made(kernels, shipped, 10000, 5, [1], SOURCE_PERTURBATION)
    flat = images.reshape(10000, -1)
    assert len(np.unique(flat, axis=0)) == 10000  # round 0 holds each digit twice; a fresh round does not


@pytest.mark.parametrize("input_format", ["fp32", "u8-source"])
def test_rounds_are_visibly_new_against_every_earlier_sighting_and_still_classify(kernels, input_format):
    """The perturbation's promise (rounds.Perturbation), on LeNet-86 and 100 of mnist5k's digits seen in each
    of 20 rounds: every round has at least FRESH_SHARE of its images more than FRESH_THRESHOLD (twice the
    loosest tolerance) from each earlier sighting, round 0 included, and the float64 reference still
    classifies most of them as their labels."""
    batch = load_batch(LENET, "mnist5k", 100, input_format)
    shipped = batch.shipped[:100]  # a dataset of 100: every round sees each image again
    perturbation = SOURCE_PERTURBATION if batch.input_format.source else PERTURBATION
    rounds = made(kernels, shipped, 100, draw_seed(), range(1, 21), perturbation)
    order = round_sources(100, 100, 0)
    sightings = [reference_forward(batch.network, batch.weights, shipped[order])]
    labels = batch.dataset.labels[:100][order]
    assert FRESH_THRESHOLD == 2 * max(TOLERANCE.values())
    right = []
    for images in rounds:
        logits = reference_forward(batch.network, batch.weights, images)
        nearest = np.min([np.max(np.abs(logits - s), 1) / np.max(np.abs(s), 1) for s in sightings], axis=0)
        assert fresh_share(nearest) >= FRESH_SHARE
        right.append(np.mean(np.argmax(logits, 1) == labels))
        sightings.append(logits)
    # Measured here over 80 rounds of fresh seeds: 0.972 (fp32) and 0.953 (u8-source) on average, the worst
    # round 0.93 and 0.91. A round is 100 images, so one round alone sways by ~2 points: the promise is held
    # on the 2,000 images together, and a round only to what no fair draw of 100 falls below.
    assert np.mean(right) >= 0.9 and min(right) >= 0.8, right


# -- the ledger ---------------------------------------------------------------------------------------------
def test_occurrence_counts_the_equal_values_before_each():
    assert _occurrence(np.array([5, 3, 5, 5, 3, 9])).tolist() == [0, 0, 1, 2, 1, 0]


def test_the_ledger_gives_each_image_its_nearest_earlier_sighting(kernels):
    gpu, stream = kernels.gpu, FakeStream()
    rng = np.random.default_rng(8)
    ledger = Ledger(kernels, 6, (10,))
    kept: dict[int, list[np.ndarray]] = {}
    for r in range(9):  # past the ledger's first capacity: it grows and keeps what it held
        sources = rng.integers(0, 6, 8)
        truth = rng.standard_normal((8, 10))
        truth[0] = kept[int(sources[0])][-1] * (1 + 1e-3) if int(sources[0]) in kept else truth[0]
        nearest = ledger.sight(gpu.to_device(truth, stream), sources, stream)
        for i, s in enumerate(sources.tolist()):
            earlier = kept.get(s, [])
            want = min((np.max(np.abs(truth[i] - e)) / np.max(np.abs(e)) for e in earlier), default=1e308)
            assert nearest[i] == pytest.approx(want, rel=1e-12), (r, i)
            kept.setdefault(s, []).append(truth[i])
    assert ledger.capacity >= max(len(v) for v in kept.values())
    ledger.reset()  # a new scope: nothing sighted before
    assert ledger.sight(gpu.to_device(truth[:6], stream), np.arange(6), stream).tolist() == [1e308] * 6


def test_a_large_output_keeps_a_strided_signature(kernels):
    gpu, stream = kernels.gpu, FakeStream()
    ledger = Ledger(kernels, 2, (8, 100))
    assert ledger.values == 256 and ledger.stride == 3
    truth = np.arange(2 * 800, dtype=np.float64).reshape(2, 8, 100) + 1
    ledger.sight(gpu.to_device(truth, stream), np.array([0, 1]), stream, judge=False)
    kept = gpu.read(ledger.seen)[: 2 * 256].reshape(2, 256)
    assert np.array_equal(kept, truth.reshape(2, -1)[:, ::3][:, :256])
