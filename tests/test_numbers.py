"""convsweep.base.numbers: medians skip what was not measured; what JSON cannot hold becomes null."""
import math

import numpy as np
import pytest

from convsweep.base.numbers import (finite, fixed, median, middle, percent, rounded, rounded_percent, short, signed_percent,
                                    significant, times)


def test_median_skips_none():
    assert median([3.0, None, 1.0, None, 2.0]) == 2.0
    assert median([None, 4.0, 1.0]) == 2.5  # even count: the mean of the middle two, None not counted
    assert median([7]) == 7


@pytest.mark.parametrize("values", [[], None, [None], [None, None], ()])
def test_median_of_nothing_is_none(values):
    assert median(values) is None


def test_median_of_random_values_with_gaps():
    rng = np.random.default_rng()
    for count in (1, 2, 7, 10):
        values = rng.standard_normal(count)
        with_gaps = [float(v) for v in values]
        for position in rng.integers(0, count + 1, size=3):
            with_gaps.insert(int(position), None)
        assert median(with_gaps) == pytest.approx(float(np.median(values.astype(np.float64))), rel=1e-15, abs=1e-15)
    assert median(iter([2.0, None, 1.0])) == 1.5  # any iterable, consumed once


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan"),
                                   np.float64("inf"), np.float16("-inf"), None])
def test_finite_maps_non_finite_and_none_to_none(value):
    assert finite(value) is None


def test_finite_makes_numpy_numbers_python_floats():
    rng = np.random.default_rng()
    for value in (np.float32(rng.standard_normal()), np.float64(rng.standard_normal()),
                  np.float16(rng.standard_normal()), np.int64(rng.integers(-100, 100)), 3, 2.5):
        result = finite(value)
        assert type(result) is float and result == float(np.float64(value))
    assert finite(np.float64(1e308)) == 1e308 and finite(-0.0) == 0.0 and math.copysign(1, finite(-0.0)) == -1


def test_middle_is_a_number_or_refuses_nothing():
    assert middle([3.0, 1.0, 2.0]) == 2.0 and middle(v for v in (4.0, 1.0)) == 2.5
    with pytest.raises(ValueError):
        middle([])


def test_every_table_writes_a_number_the_same_way():
    """The report's, query's and compare's formatters, one module: each case is what a reader sees."""
    assert [significant(v) for v in (0.2032, 12.5, 999.96, 12345.6, None)] == ["0.2032", "12.50", "1000", "12346", ""]
    assert [short(v) for v in (0.2032, 12345678.0, 0.0, math.inf, -0.00012341, -1.2341e-5)] == \
        ["0.2032", "1.235e+07", "0.0", "inf", "-0.0001234", "-1.234e-05"]
    assert [fixed(0.99321, 4), percent(0.125), percent(None)] == ["0.9932", "12.5", ""]
    assert [signed_percent(1.052), signed_percent(0.9), signed_percent(None)] == ["+5.2%", "-10.0%", ""]
    assert [times(1.3), times(12.2), times(124.4), times(None), times(None, "")] == ["1.30×", "12.2×", "124×", "—", ""]
    assert [rounded_percent(0.12345), rounded(0.123456), rounded(None)] == [12.3, 0.123, None]


def test_query_and_report_cells_use_the_shared_formatters():
    from convsweep.analysis import query

    assert query._cell(1234.5678) == short(1234.5678, query.TABLE_SIGNIFICANT_DIGITS) == "1235"
