"""Is a result right? One set of checks and messages for jobs and the bench alike.

Every output is compared with a float64 reference normwise (max |y - ref| / max |ref|) against
the loosest tolerance of the variants that produced it. Unwritten elements show as NaN because
outputs are poisoned before a kernel runs. Logits must also classify like the reference.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from convsweep.base.numbers import finite

if TYPE_CHECKING:  # numpy is imported where it is used: Snakemake's planning reads TOLERANCE
    import numpy as np  # (through the registry) and would pay ~0.35 s for it on the lent GPU's host

TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2}  # normwise error allowed per precision class
ACCURACY_SLACK = {"fp16": 0.005}  # fp16-class runs may differ from the reference's accuracy by 0.5 points
MIN_AGREEMENT = 0.999  # other runs must predict the reference's class on 99.9% of images
PRECISION_ORDER = ("fp32", "tf32", "fp16")  # loosest last: a mixed network is judged by its loosest layer


@dataclass(frozen=True)
class Check:
    """The verdict on one output: `ok` or `incorrect` with the reason, and the numbers behind it."""

    status: str
    error: str | None
    max_rel_err: float | None
    accuracy: float | None = None
    prediction_agreement: float | None = None

    def record(self) -> dict:
        return asdict(self)


def normwise_error(y: np.ndarray, ref: np.ndarray) -> float:
    """max |y - ref| / max |ref| (NaN propagates, so an unwritten element is never within tolerance)."""
    import numpy as np

    if not y.size:
        return 0.0
    scale = float(np.max(np.abs(ref))) or 1.0
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(y.astype(np.float64) - ref))) / scale


def _error_verdict(err: float, tolerance: float, all_written: bool = True) -> str | None:
    if not all_written or not math.isfinite(err):
        return "output holds NaN or Inf (unwritten or overflowed elements)"
    if err > tolerance:
        return f"max relative error {err:.3g} exceeds the {tolerance:g} tolerance"
    return None


def check_output(y: np.ndarray, ref: np.ndarray, tolerance: float, all_written: bool = True) -> Check:
    """A (subset of a) conv output against its float64 reference; `all_written`: the whole output,
    not only the checked subset, is finite."""
    if y.shape != ref.shape:
        return Check("incorrect", f"output shape {y.shape}, expected {ref.shape}", None)
    err = normwise_error(y, ref)
    error = _error_verdict(err, tolerance, all_written)
    return Check("incorrect" if error else "ok", error, finite(err))


@dataclass(frozen=True)
class RowStats:
    """An output against its float64 reference, image by image: the largest |y - ref| over y's finite
    elements, the largest |ref|, the first index of each one's largest value (a classifier's prediction)
    and how many of y's elements are NaN or infinite. The device computes them (kernels/truth.cu,
    compare_*) as `of` does on the host; the verdict reads these alone."""

    diff: np.ndarray
    scale: np.ndarray
    predicted: np.ndarray
    expected: np.ndarray
    bad: np.ndarray

    @classmethod
    def of(cls, y: np.ndarray, ref: np.ndarray) -> RowStats:
        import numpy as np

        y = np.asarray(y).reshape(len(y), -1).astype(np.float64)
        ref = np.asarray(ref, np.float64).reshape(len(ref), -1)
        finite_y = np.isfinite(y)
        with np.errstate(invalid="ignore"):
            diff = np.where(finite_y, np.abs(y - ref), 0.0)
        if not y.shape[1]:
            empty = np.zeros(len(y))
            return cls(empty, empty, empty.astype(np.int64), empty.astype(np.int64), empty)
        return cls(diff.max(axis=1), np.abs(ref).max(axis=1), np.argmax(np.where(finite_y, y, -np.inf), axis=1),
                   np.argmax(ref, axis=1), (~finite_y).sum(axis=1).astype(np.float64))

    @property
    def error(self) -> float:
        """max |y - ref| / max |ref| over the whole output (the absolute error where ref is all zero);
        NaN where any element of y is not finite."""
        import numpy as np

        if not len(self.diff):
            return 0.0
        if self.bad.any():
            return math.nan
        return float(np.max(self.diff)) / (float(np.max(self.scale)) or 1.0)


def verdict(stats: RowStats, labels: np.ndarray | None, variants) -> Check:
    """One run's output: finite and within the loosest tolerance of the `variants` that made it
    (anything with .precision and .tolerance), and with `labels` (those of its images, or None)
    classifying like the reference: the same prediction on 99.9% of images, or for fp16-class runs an
    accuracy within 0.5 points of the reference's. Either allows one image at least: at batch 100 one near-tie
    resolved the other way is a whole point (fp16_fused_network on a fresh round of 100, on the lent H100: 0.92
    against the reference's 0.93, within tolerance), and the tolerance alone already bounds which images can flip."""
    import numpy as np

    variants = list(variants)
    precisions = [v.precision for v in variants]
    err = stats.error
    accuracy = agreement = None
    if labels is not None:
        accuracy = float(np.mean(stats.predicted == labels))
        agreement = float(np.mean(stats.predicted == stats.expected))
    error = _error_verdict(err, max(v.tolerance for v in variants))
    if error is None and labels is not None:
        slack = max(ACCURACY_SLACK.get(p, -1.0) for p in precisions)
        images = len(labels)
        ref_accuracy = float(np.mean(stats.expected == labels))
        assert accuracy is not None and agreement is not None  # with the labels, above
        # Counted in images, not in shares: 0.93 - 0.92 is 0.010000000000000009.
        right_off = abs(int(np.sum(stats.predicted == labels)) - int(np.sum(stats.expected == labels)))
        differ = int(np.sum(stats.predicted != stats.expected))
        if slack >= 0 and right_off > allowed_images(slack, images):
            error = (f"accuracy {accuracy:.4f} is more than {slack * 100:g} points from the reference's "
                     f"{ref_accuracy:.4f} ({right_off} images of {images})")
        elif slack < 0 and differ > allowed_images(1 - MIN_AGREEMENT, images):
            error = (f"predictions match the reference on {agreement:.2%} of images (needs {MIN_AGREEMENT:.1%}; one "
                     f"image may differ at any batch)")
    return Check("incorrect" if error else "ok", error, finite(err), accuracy, agreement)


def allowed_images(share: float, images: int) -> int:
    """How many of `images` may go the other way for a `share`: one at least."""
    return max(1, math.floor(share * images + 1e-9))


def check_logits(logits: np.ndarray, ref: np.ndarray, labels: np.ndarray | None, idx: np.ndarray,
                 variants) -> Check:
    """`verdict` on logits and their reference on the host; `labels[idx]` are the images' labels."""
    return verdict(RowStats.of(logits, ref), None if labels is None else labels[idx], variants)


def check_indices(batch: int, n: int) -> np.ndarray:
    """The first and the last n images of a batch (each once): both ends of the index range."""
    import numpy as np

    return np.unique(np.concatenate([np.arange(min(n, batch)), np.arange(max(batch - n, 0), batch)]))


def loosest_precision(precisions) -> str:
    return max(precisions, key=PRECISION_ORDER.index)
