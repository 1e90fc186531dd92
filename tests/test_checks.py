"""convsweep.model.checks: normwise errors against float64, the verdicts and their messages, logits rules."""
import numpy as np
import pytest

from convsweep.model.checks import (PRECISION_ORDER, TOLERANCE, Check, check_indices, check_output, loosest_precision,
                              normwise_error)
from convsweep.model.variants import load_registry


def independent_error(y, ref) -> float:
    """max |y - ref| / max |ref| in float64 through the infinity norm of the flattened arrays."""
    diff = np.asarray(y, dtype=np.float64).ravel() - np.asarray(ref, dtype=np.float64).ravel()
    return float(np.linalg.norm(diff, np.inf) / np.linalg.norm(np.asarray(ref, np.float64).ravel(), np.inf))


# -- normwise_error -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4, 5)])
def test_normwise_error_matches_float64(shape):
    rng = np.random.default_rng()
    ref = rng.standard_normal(shape) * rng.uniform(0.1, 100)
    y = (ref + rng.standard_normal(shape) * 1e-3).astype(np.float32)
    assert normwise_error(y, ref) == pytest.approx(independent_error(y, ref), rel=1e-12)


def test_normwise_error_subtracts_in_float64():
    """A float32 output of a large float64 reference: the rounding is the error, and float32 arithmetic
    (casting the reference down) would report zero."""
    rng = np.random.default_rng()
    ref = 1e4 + rng.uniform(0, 1e-2, size=1000)
    y = ref.astype(np.float32)
    expected = independent_error(y, ref)
    assert expected > 0
    assert normwise_error(y, ref) == pytest.approx(expected, rel=1e-12)


def test_normwise_error_edge_cases():
    y = np.array([0.5, -2.0])
    assert normwise_error(y, np.zeros(2)) == 2.0  # an all-zero reference: the absolute error
    assert np.isnan(normwise_error(np.array([1.0, np.nan]), np.array([1.0, 1.0])))
    assert normwise_error(np.array([1.0, np.inf]), np.array([1.0, 1.0])) == np.inf


# -- check_output ---------------------------------------------------------------------------------
def test_check_output_shape_mismatch_names_both_shapes():
    ref = np.zeros((2, 3, 4, 5))
    check = check_output(np.zeros((2, 3, 5, 4), np.float32), ref, 1e-5)
    assert check.status == "incorrect" and check.max_rel_err is None
    assert check.error == "output shape (2, 3, 5, 4), expected (2, 3, 4, 5)"


def test_check_output_within_and_over_the_tolerance():
    rng = np.random.default_rng()
    ref = rng.standard_normal((4, 3, 6, 6))
    y = (ref + rng.standard_normal(ref.shape) * 1e-4).astype(np.float32)
    err = independent_error(y, ref)
    ok = check_output(y, ref, err * 1.01)
    assert (ok.status, ok.error) == ("ok", None) and ok.max_rel_err == pytest.approx(err, rel=1e-12)
    assert type(ok.max_rel_err) is float
    bad = check_output(y, ref, err * 0.99)
    assert bad.status == "incorrect" and bad.max_rel_err == pytest.approx(err, rel=1e-12)
    assert bad.error == f"max relative error {err:.3g} exceeds the {err * 0.99:g} tolerance"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_check_output_nan_or_inf_in_the_checked_part(bad):
    rng = np.random.default_rng()
    ref = rng.standard_normal((2, 1, 3, 3))
    y = ref.astype(np.float32)
    y[tuple(rng.integers(0, n) for n in y.shape)] = bad
    check = check_output(y, ref, 1.0)  # however loose the tolerance
    assert check.status == "incorrect" and check.max_rel_err is None
    assert check.error == "output holds NaN or Inf (unwritten or overflowed elements)"


def test_check_output_unwritten_elements_outside_the_checked_part():
    ref = np.random.default_rng().standard_normal((3, 2, 4, 4))
    check = check_output(ref.astype(np.float32), ref, 1e-5, all_written=False)
    assert check.status == "incorrect" and "NaN" in check.error
    assert check.max_rel_err is not None and check.max_rel_err < 1e-7  # the checked part itself was fine
    assert check_output(ref.astype(np.float32), ref, 1e-5, all_written=True).status == "ok"


def test_check_record_holds_every_field():
    record = Check("incorrect", "why", 0.5, 0.9, 0.99).record()
    assert record == {"status": "incorrect", "error": "why", "max_rel_err": 0.5, "accuracy": 0.9,
                      "prediction_agreement": 0.99}


# -- check_indices, precisions --------------------------------------------------------------------
def test_check_indices_take_both_ends_once():
    assert check_indices(100, 3).tolist() == [0, 1, 2, 97, 98, 99]
    assert check_indices(4, 8).tolist() == [0, 1, 2, 3]
    assert check_indices(5, 3).tolist() == [0, 1, 2, 3, 4]  # overlapping ends, each image once
    assert check_indices(6, 0).tolist() == []
    rng = np.random.default_rng()
    for batch, n in rng.integers(1, 200, size=(20, 2)):
        expected = sorted(set(range(min(n, batch))) | set(range(max(batch - n, 0), batch)))
        assert check_indices(int(batch), int(n)).tolist() == expected


def test_loosest_precision():
    assert loosest_precision(["fp32"]) == "fp32"
    assert loosest_precision(["fp32", "tf32", "fp32"]) == "tf32"
    assert loosest_precision(("tf32", "fp16", "fp32")) == "fp16"
    assert loosest_precision(iter(["fp16", "tf32"])) == "fp16"
    with pytest.raises(ValueError):
        loosest_precision(["fp8"])


def test_tolerances_are_the_precisions_variants_declare():
    declared = {variant.precision for variant in load_registry().values()}
    assert set(TOLERANCE) == declared
    assert set(PRECISION_ORDER) == set(TOLERANCE)
    tolerances = [TOLERANCE[p] for p in PRECISION_ORDER]
    assert tolerances == sorted(tolerances) and len(set(tolerances)) == len(tolerances)  # loosest last


# -- check_logits (moved from test_job.py) --------------------------------------------------------
def _check(logits, ref, labels, precision):
    from types import SimpleNamespace

    from convsweep.model.checks import check_logits

    var = SimpleNamespace(precision=precision, tolerance={"fp32": 1e-5, "fp16": 1e-2}[precision])
    check = check_logits(np.asarray(logits, float), np.asarray(ref, float), labels,
                         np.arange(len(labels)) if labels is not None else None, [var])
    return check.status, check.error, check.max_rel_err, check.accuracy, check.prediction_agreement


def test_check_logits_error_nan_and_unlabelled():
    ref = np.eye(10)[np.arange(1000) % 10] * 10.0  # 1000 images, the reference predicts i % 10
    labels = np.arange(1000) % 10
    assert _check(ref, ref, labels, "fp32")[:1] + _check(ref, ref, labels, "fp32")[3:] == ("ok", 1.0, 1.0)
    poisoned = ref.copy()
    poisoned[3, 3] = np.nan
    status, error, *_ = _check(poisoned, ref, labels, "fp32")
    assert status == "incorrect" and "NaN" in error
    status, error, err, accuracy, agreement = _check(ref + 1e-3, ref, None, "fp32")
    assert status == "incorrect" and "tolerance" in error and accuracy is None and agreement is None


def test_check_logits_prediction_rules_per_precision():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((1000, 10))
    labels = np.argmax(ref, 1)
    close = ref.copy()
    top2 = np.argsort(ref[:2], axis=1)[:, -2:]
    for i in range(2):  # two near-ties resolved the other way: tiny error, two changed predictions
        a, b = top2[i]
        close[i, a], close[i, b] = ref[i, b], ref[i, a]
    tolerance = 2 * np.max(np.abs(close - ref)) / np.max(np.abs(ref))  # the error check alone passes

    from types import SimpleNamespace
    from convsweep.model.checks import check_logits

    fp32 = SimpleNamespace(precision="fp32", tolerance=tolerance)
    check = check_logits(close, ref, labels, np.arange(1000), [fp32])
    assert check.status == "incorrect" and "99.80% of images" in check.error  # fp32-class: needs 99.9% identical
    fp16 = SimpleNamespace(precision="fp16", tolerance=tolerance)
    check = check_logits(close, ref, labels, np.arange(1000), [fp16])
    assert check.status == "ok" and check.accuracy == 0.998 and check.prediction_agreement == 0.998  # within 0.5 points


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_small_batch_may_resolve_one_near_tie_the_other_way_and_no_more(precision):
    """At batch 100 one image is a whole point and 1% of the predictions: one near-tie flipped is within both rules,
    two are not (found on the lent H100: an honest fp16 kernel `incorrect` at 0.92 against 0.93)."""
    from types import SimpleNamespace
    from convsweep.model.checks import check_logits

    rng = np.random.default_rng(3)
    ref = rng.standard_normal((100, 10))
    labels = np.argmax(ref, 1)

    def flipped(count):
        out = ref.copy()
        for i in range(count):
            a, b = np.argsort(ref[i])[-2:]
            out[i, a], out[i, b] = ref[i, b], ref[i, a]
        return out

    variant = SimpleNamespace(precision=precision, tolerance=1.0)  # the error check passes: only the predictions
    assert check_logits(flipped(1), ref, labels, np.arange(100), [variant]).status == "ok"
    check = check_logits(flipped(2), ref, labels, np.arange(100), [variant])
    assert check.status == "incorrect", check
    assert ("2 images of 100" if precision == "fp16" else "98.00% of images") in check.error, check.error


def test_an_empty_output_has_no_error():
    assert normwise_error(np.empty((0, 10)), np.empty((0, 10))) == 0.0
