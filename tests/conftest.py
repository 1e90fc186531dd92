import os
from collections import Counter
from pathlib import Path

import pytest
from gpu_turns import TURNS_ENV, gpu_turn

# The two-backend `db_url` fixture (SQLite file, throwaway PostgreSQL database) for every module.
pytest_plugins = ["store_fixtures"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook turns -n into its workers
def pytest_cmdline_main(config):
    # The whole suite (a bare `pytest`, as README and CI run it) goes over every core with pytest-xdist
    # (the test extra brings it): its NVRTC builds and Snakemake sweeps are most of its time. Worksteal
    # hands each worker a contiguous run of tests (a module's fixtures are made once) and moves the
    # rest to whichever finishes first. Named files or tests, an explicit -n (-n0: one process), --pdb
    # or a pytest without xdist run here, in this one process; so does each worker.
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not hasattr(config, "workerinput")
    if getattr(config.option, "numprocesses", 0) is None and whole_suite and not config.option.usepdb:
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "worksteal"


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path plugin has set up its factory
def pytest_configure(config):
    # The shipped registry only: a developer's own kernel directories (convsweep.model.variants) are not
    # what the tests are about; a test that wants extra variants (the red team) sets the variable.
    os.environ.pop("CONVSWEEP_VARIANTS", None)
    # A private cache per test session: tests never depend on what a previous run left behind.
    if "CONVSWEEP_CACHE" not in os.environ:
        cache = config._tmp_path_factory.mktemp("convsweep-cache") if hasattr(config, "_tmp_path_factory") else None
        if cache is not None:
            os.environ["CONVSWEEP_CACHE"] = str(cache)
    # The directory of the GPU turns (gpu_turns.py), one per session: made by the controller (or the
    # one process) before its workers start, so they inherit the variable; never an outer session's.
    if not hasattr(config, "workerinput") and hasattr(config, "_tmp_path_factory"):
        os.environ[TURNS_ENV] = str(config._tmp_path_factory.mktemp("gpu-turns"))


def pytest_collection_modifyitems(config, items):
    from convsweep.device.gpu import gpu_available

    if not any("gpu" in item.keywords for item in items):
        return
    ok, why = gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_ALL_BYTES = bytes(range(256))


@pytest.fixture(autouse=True)
def _one_byte_objects_intact():
    # CPython shares one object per one-byte bytes value (b"\0", b"\n", ...); code that writes through a
    # buffer into one changes that literal everywhere in the process, and later tests fail far from the cause.
    yield
    changed = [i for i in range(256) if _ALL_BYTES[i : i + 1][0] != i]
    if changed:
        pytest.fail(f"this test wrote into CPython's shared one-byte bytes objects (values {changed[:8]})")


@pytest.fixture(autouse=True)
def _fake_passes_keep_three_caching_rounds(request, monkeypatch):
    # The fake GPU's passes are fractions of a millisecond of fake time, for which the caching test would time 9
    # rounds (convsweep.measure.integrity.caching_rounds) of real host work each: the CPU tests keep its 3 (the
    # rule itself is tested with its own constant in tests/test_integrity.py); the `gpu` tests time real passes.
    if request.node.get_closest_marker("gpu") is None:
        from convsweep.measure import integrity

        monkeypatch.setattr(integrity, "CACHING_TIMED_MS", 0.0)
    yield


@pytest.fixture(autouse=True)
def _gpu_turn(request):
    # A `gpu` test shares the GPU with the other workers' GPU tests; an `alone` test waits for it to itself.
    directory = os.environ.get(TURNS_ENV)
    if request.node.get_closest_marker("gpu") is None or directory is None:
        yield
        return
    with gpu_turn(Path(directory), alone=request.node.get_closest_marker("alone") is not None):
        yield


def pytest_terminal_summary(terminalreporter):
    """The skips, one line per reason with how many it covers (`-ra` printed one per test file and line: 211
    lines of the same GPU reason on a machine without one)."""
    reasons = Counter(_skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.line(f"{count:5d}  {reason}")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")
