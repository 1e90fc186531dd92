"""convsweep.base.paths: resolve_network_path (absolute as given, beside the naming file, then the checkout), and stored
names as safe file names inside the results directory."""
import re
from pathlib import Path

import pytest

from convsweep.base.paths import NAME_MAX_CHARS, RESULTS_DIR, ROOT, resolve_network_path, results_directory, safe_name

LENET = "networks/lenet86.yaml"


def test_the_checkout_has_the_network_these_tests_name():
    assert (ROOT / LENET).is_file()


def test_an_absolute_path_is_taken_as_given(tmp_path):
    absolute = tmp_path / "elsewhere" / "missing.yaml"  # even when it does not exist
    assert resolve_network_path(absolute, ROOT) == absolute
    assert resolve_network_path(str(absolute)) == absolute
    assert resolve_network_path(ROOT / LENET, tmp_path) == ROOT / LENET


def test_a_file_beside_the_naming_file_wins_over_the_checkout(tmp_path):
    beside = tmp_path / LENET
    beside.parent.mkdir()
    beside.write_text("name: local copy\n")
    assert resolve_network_path(LENET, tmp_path) == beside
    assert resolve_network_path(Path(LENET), str(tmp_path)) == beside


def test_falls_back_to_the_checkout(tmp_path):
    assert resolve_network_path(LENET, tmp_path) == ROOT / LENET
    assert resolve_network_path(LENET) == ROOT / LENET
    (tmp_path / LENET).mkdir(parents=True)  # a directory of that name is not a network file
    assert resolve_network_path(LENET, tmp_path) == ROOT / LENET


def test_found_nowhere_is_the_first_candidate(tmp_path):
    missing = "networks/no-such-network.yaml"
    assert not (ROOT / missing).exists()
    assert resolve_network_path(missing, tmp_path) == tmp_path / missing
    assert resolve_network_path(missing) == ROOT / missing


# -- names from stored data as file names ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lenet86-baseline", "conv256_5x5", "fp16.v2", "tf32+tc", "a" * NAME_MAX_CHARS])
def test_a_plain_name_is_its_own_file_name(name):
    assert safe_name(name) == name


@pytest.mark.parametrize("name", ["/tmp/abs", "../../escape", "..", ".", ".hidden", "a/b", "a\\b", "", "x" * 30_000,
                                  "new\nline", "nul\0byte", "é", "-flag", "run-0123456789ab", "0123456789ab"])
def test_any_other_name_becomes_one_safe_component_that_keeps_it_apart(name):
    safe = safe_name(name)
    assert safe != name and 0 < len(safe) <= NAME_MAX_CHARS
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", safe), safe
    assert Path(safe).name == safe and safe not in (".", "..") and not Path(safe).is_absolute()
    assert safe_name(safe) != safe  # not a plain name itself: no name taken as it is can be this file
    assert safe == safe_name(name)  # the same name, the same file every time


def test_names_that_read_alike_once_made_safe_stay_two_files():
    names = ["a/b", "a_b", "a b", "a\\b", "A/b", "x" * 30_000, "x" * 30_001, "run-0123456789ab"]
    assert len({safe_name(n) for n in names}) == len(names)
    assert safe_name("tmp_x-2e56aa36f538") != "tmp_x-2e56aa36f538"  # what safe_name("/tmp/x") gives is hashed again


def test_the_results_directory_of_stored_names_stays_inside_it():
    assert results_directory("lenet86-baseline", "figures") == RESULTS_DIR / "lenet86-baseline" / "figures"
    for name in ("/etc", "../..", "../../home/x/.ssh", "."):
        path = results_directory(name, "figures")
        assert path.parent.parent == RESULTS_DIR and ".." not in path.parts
