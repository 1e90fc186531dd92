import time

import pytest

from convsweep.base.errors import ConfigError
from convsweep.base.expr import MAX_MAGNITUDE, evaluate

WHERE = "variants.yaml: naive.restrictions"


def refused(expression, names=None) -> str:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        evaluate(expression, names or {}, WHERE)
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{WHERE}: ")
    return message


def test_a_tower_of_powers_is_refused_before_it_is_computed():
    assert refused("9**9**9**9") == f"{WHERE}: '9**9**9**9' computes a number beyond 2**63"
    assert refused("BLOCK ** 1000000", {"BLOCK": 256}) == f"{WHERE}: 'BLOCK ** 1000000' computes a number beyond 2**63"
    assert refused("2**64") == f"{WHERE}: '2**64' computes a number beyond 2**63"
    assert evaluate("2**63", {}) == MAX_MAGNITUDE and evaluate("(-2)**3", {}) == -8 and evaluate("4**0.5", {}) == 2.0


def test_every_value_stays_within_64_bits():
    assert "beyond 2**63" in refused("4294967296 * 4294967296 * 4")
    assert "beyond 2**63" in refused("9" * 400)  # a literal
    assert "beyond 2**63" in refused("10.0 ** 400")  # a float past 1.8e308
    assert "beyond 2**63" in refused("ceil(1e300)")
    assert "complex number" in refused("(-8) ** 0.5")


def test_long_and_deep_expressions_are_refused():
    assert refused("1+" * 300 + "1").endswith("characters long; at most 500")
    assert refused("-" * 100 + "1").endswith("nests more than 32 operations")
    assert refused("9" * 5000).endswith("is 5,000 characters long; at most 500")


def test_arithmetic_errors_are_one_line():
    assert refused("M / TILE", {"M": 4, "TILE": 0}) == f"{WHERE}: 'M / TILE': division by zero"
    assert refused("min()") == f"{WHERE}: 'min()': min expected at least 1 argument, got 0"
    assert refused("MODE * 1000000000", {"MODE": "fast"}) == \
        f"{WHERE}: 'MODE * 1000000000' does arithmetic on 'fast', which is not a number"
    assert evaluate("MODE == M", {"MODE": "fast", "M": "fast"}) is True  # a string tunable still compares
