"""The numbers behind every verdict: spread, the bootstrap comparison on synthetic samples with a
known shift (and none), and the stopping rule of repeats auto."""
import numpy as np
import pytest

from convsweep.base.stats import FASTER, SAME, SLOWER, UNSURE, StoppingRule, compare_samples, relative_spread


def noisy(centre: float, n: int, noise: float, seed: int) -> list[float]:
    """n timings around `centre` with relative Gaussian noise, like a quiet GPU's."""
    return list(centre * (1 + noise * np.random.default_rng(seed).standard_normal(n)))


def test_spread_is_the_median_absolute_deviation_over_the_median():
    assert relative_spread([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(1 / 3)  # one outlier barely moves it
    assert relative_spread([2.0, 2.0, 2.0]) == 0.0
    assert relative_spread([]) is None and relative_spread([0.0, 0.0]) is None


@pytest.mark.parametrize("shift, verdict", [(1.0, SAME), (1.02, SAME), (0.98, SAME), (1.10, SLOWER), (0.90, FASTER)])
def test_a_known_shift_gets_its_verdict(shift, verdict):
    for seed in range(5):  # fresh draws each time: the verdict must not hang on one lucky sample
        a, b = noisy(1.0, 20, 0.005, seed), noisy(shift, 20, 0.005, 100 + seed)
        change = compare_samples(a, b, threshold=0.05)
        assert change.verdict == verdict, (seed, change)
        assert change.low <= change.ratio <= change.high
        assert change.low < shift * 1.01 and change.high > shift * 0.99  # the interval holds the true ratio


def test_too_few_or_too_noisy_samples_are_unsure():
    assert compare_samples([1.0, 1.0], [2.0, 2.0]).verdict == UNSURE  # a doubling, but two samples each
    wide = compare_samples(noisy(1.0, 6, 0.2, 1), noisy(1.06, 6, 0.2, 2), threshold=0.05)
    assert wide.verdict == UNSURE and wide.high - wide.low > 0.1


def test_the_interval_is_reproducible():
    a, b = noisy(1.0, 12, 0.01, 3), noisy(1.03, 12, 0.01, 4)
    assert compare_samples(a, b) == compare_samples(a, b)


def test_a_fixed_count_stops_at_it():
    rule = StoppingRule.of(3, None)
    assert [rule.reason(1.0, 0.0) for _ in range(3)] == [None, None, "fixed"]
    assert rule.record("fixed") == {"rule": "fixed", "reason": "fixed", "samples": 3, "noise": 0.0, "measured_s": 0.003}


def test_auto_stops_once_quiet_long_and_many_enough():
    rule = StoppingRule.of("auto", {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.5, "timeout_s": 15})
    times = iter(noisy(100.0, 40, 0.001, 1))  # 100 ms passes, 0.1% noise: quiet from the start
    while (reason := rule.reason(next(times), 0.1 * len(rule.samples_ms))) is None:
        pass
    record = rule.record(reason)  # the 10th sample: 1 s measured, noise well under 0.5%
    assert record["reason"] == "converged" and record["samples"] == 10 and record["noise"] < 0.005


def test_auto_waits_for_the_measured_time_and_gives_up_at_the_timeout():
    short = StoppingRule.of("auto", {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.5, "timeout_s": 15,
                                     "max_samples": 1000})
    reasons = [short.reason(1.0, 0.001 * i) for i in range(600)]  # 1 ms passes: 0.5 s takes 500 of them
    assert reasons.index("converged") == 499
    loud = StoppingRule.of("auto", {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.5, "timeout_s": 2.0})
    reasons = [loud.reason(t, 0.1 * i) for i, t in enumerate(noisy(100.0, 40, 0.05, 2))]  # 5% noise never converges
    assert "converged" not in reasons and reasons.index("timeout") == 20
    assert loud.record("timeout")["noise"] > 0.005


def test_auto_stops_at_its_sample_cap():
    """A job under nsys traces every pass: 0.1 ms passes for 15 s would be 150,000 of them."""
    rule = StoppingRule.of("auto", {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.5, "timeout_s": 15})
    while (reason := rule.reason(0.1, 0.0001 * len(rule.samples_ms))) is None:
        pass
    assert reason == "max_samples" and rule.record(reason)["samples"] == 200  # the default cap
