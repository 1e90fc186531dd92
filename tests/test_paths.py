"""convsweep.paths.resolve_network_path: absolute as given, beside the naming file, then the checkout."""
from pathlib import Path

from convsweep.paths import ROOT, resolve_network_path

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
