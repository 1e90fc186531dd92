"""How sure a timing is: the spread of its samples, and whether two sets of samples differ.

Spread is the median absolute deviation relative to the median (robust: one preempted sample
does not widen it, as it would a standard deviation). Two results are compared by the ratio of
their medians, B over A, with a bootstrap percentile interval over the stored samples: it bounds
the very number reported (unlike a Mann-Whitney p-value, which says only that the distributions
differ somewhere), needs no distribution, and stays honest with the ten-odd samples a run keeps.
The verdict puts that interval against a threshold, as asv and nvbench's compare script do.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .numbers import median, middle

SAME, FASTER, SLOWER, UNSURE = "SAME", "FASTER", "SLOWER", "UNSURE"
MIN_SAMPLES = 5  # fewer per side and a bootstrap interval means nothing: the verdict is UNSURE
RESAMPLES = 4000
CONFIDENCE = 0.95


def relative_spread(values: Sequence[float]) -> float | None:
    """Median absolute deviation over the median; None for no samples or a zero median. (Without
    numpy: storing a result needs this, and numpy's import is a tenth of a second of the ingest.)"""
    centre = median(values)
    return middle(abs(v - centre) for v in values if v is not None) / centre if centre else None


@dataclass(frozen=True)
class Change:
    """B against A: the ratio of medians (above 1: B is slower), its interval, and the verdict."""

    ratio: float | None
    low: float | None
    high: float | None
    verdict: str
    samples_a: int
    samples_b: int


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES,
                    confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float, float]:
    """median(b) / median(a) and its bootstrap percentile interval (each side resampled with
    replacement on its own); seeded, so one pair of sample sets always gets the same interval."""
    import numpy as np

    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(xa, size=(resamples, xa.size)), axis=1)
    med_b = np.median(rng.choice(xb, size=(resamples, xb.size)), axis=1)
    ratios = med_b / med_a
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(np.median(xb) / np.median(xa)), float(low), float(high)


def compare_samples(a: Sequence[float], b: Sequence[float], threshold: float = 0.05) -> Change:
    """SLOWER: B's median is slower by at least `threshold` and the interval lies above 1;
    FASTER: the mirror image; SAME: the whole interval lies within the threshold either way;
    UNSURE: anything else (a wide interval, or fewer than MIN_SAMPLES samples on a side)."""
    a = [v for v in a if v is not None and v > 0]
    b = [v for v in b if v is not None and v > 0]
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        ratio = middle(b) / middle(a) if a and b else None
        return Change(ratio, None, None, UNSURE, len(a), len(b))
    ratio, low, high = bootstrap_ratio(a, b)
    band_low, band_high = 1 / (1 + threshold), 1 + threshold
    if low > 1 and ratio >= band_high:
        verdict = SLOWER
    elif high < 1 and ratio <= band_low:
        verdict = FASTER
    elif band_low <= low and high <= band_high:
        verdict = SAME
    else:
        verdict = UNSURE
    return Change(ratio, low, high, verdict, len(a), len(b))


# Two settings measured in alternation (convsweep.measure.confirm): told apart at this level, and the smallest
# difference reported is the one a test at that level would find with this power.
ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class Paired:
    """B against A measured in alternation, pass r of each back to back, so a drift of the clocks moves both:
    the median of the rounds' differences B - A, a Wilcoxon signed-rank p-value over them (two-sided), and
    the smallest difference these rounds could have told from none (at ALPHA, with POWER, from their
    robust spread). `tied`: not told apart, which is also the verdict of too few rounds."""

    difference_ms: float | None
    p_value: float | None
    detectable_ms: float | None
    rounds: int

    @property
    def tied(self) -> bool:
        return self.p_value is None or self.p_value >= ALPHA


def paired_difference(a: Sequence[float | None], b: Sequence[float | None]) -> Paired:
    """B's rounds against A's (the same length, round r of each measured back to back); a round either
    side lacks is left out of both."""
    import numpy as np
    from scipy import stats

    d = np.array([y - x for x, y in zip(a, b) if x is not None and y is not None], dtype=np.float64)
    if d.size < MIN_SAMPLES:
        return Paired(float(np.median(d)) if d.size else None, None, None, int(d.size))
    p = 1.0 if not d.any() else float(stats.wilcoxon(d, zero_method="zsplit").pvalue)
    spread = 1.4826 * float(np.median(np.abs(d - np.median(d))))  # a standard deviation, robustly
    if spread == 0.0:  # over half the rounds equal, at the timer's resolution
        spread = float(np.std(d, ddof=1))
    z = float(stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER))
    return Paired(float(np.median(d)), p, z * spread / float(np.sqrt(d.size)), int(d.size))


@dataclass
class StoppingRule:
    """When a setting has been sampled enough. `repeats` fixed: after that many samples ("fixed").
    Auto (nvbench's rule, with the robust spread for its noise): once the forward times' relative
    spread is at most `max_noise` with at least `min_samples` samples and `min_time_s` of measured
    time ("converged"), once `timeout_s` of wall time has passed ("timeout"), or at `max_samples`
    ("max_samples": nvbench has no such cap, but a job under nsys traces every pass; uncapped, a
    batch-100 job of the default sweep took 3 minutes under nsys on the lent H100)."""

    repeats: int | None = None  # None: auto
    max_noise: float = 0.005
    min_samples: int = 10
    min_time_s: float = 0.5
    timeout_s: float = 15.0
    max_samples: int = 200
    samples_ms: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, repeats: int | str, stopping: dict | None) -> StoppingRule:
        return cls(**(stopping or {})) if repeats == "auto" else cls(repeats=int(repeats))

    def reason(self, forward_ms: float, elapsed_s: float) -> str | None:
        """Take one more sample (ms) after `elapsed_s` of sampling; why to stop now, or None."""
        self.samples_ms.append(forward_ms)
        n = len(self.samples_ms)
        if self.repeats is not None:
            return "fixed" if n >= self.repeats else None
        if n >= self.min_samples and sum(self.samples_ms) / 1e3 >= self.min_time_s \
                and (self.noise if self.noise is not None else 1.0) <= self.max_noise:
            return "converged"
        if elapsed_s >= self.timeout_s:
            return "timeout"
        return "max_samples" if n >= self.max_samples else None

    @property
    def noise(self) -> float | None:
        return relative_spread(self.samples_ms)

    @property
    def max_samples_taken(self) -> int:
        """The most samples this rule can take: `repeats` when fixed, else `max_samples`."""
        return self.repeats if self.repeats is not None else self.max_samples

    def record(self, reason: str) -> dict:
        """What a measurement stores about its sampling."""
        return {"rule": "fixed" if self.repeats is not None else "auto", "reason": reason,
                "samples": len(self.samples_ms), "noise": self.noise, "measured_s": sum(self.samples_ms) / 1e3}
