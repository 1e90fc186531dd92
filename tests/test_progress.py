"""Progress bars: on stderr for a terminal or when CONVSWEEP_PROGRESS=1 asks, silent otherwise, and
shown by the long work (the reference forward, a grid job's settings, bench candidates, ingest)."""
from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from convsweep import bench
from convsweep.sweep.config import JobSpec
from convsweep.measure.job import run_job
from convsweep.model.network import FORWARD_CHUNK, load_network, load_weights, reference_forward
from convsweep.base.paths import ROOT
from convsweep.base.progress import ENV_VAR, progress
from convsweep.store import ingest_files, open_store

from bench_files import GOOD, write
from fake_gpu import FAKE
from store_fixtures import make_job_file, make_result, write_results


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def count_to_three() -> list[int]:
    return list(progress(range(3), desc="counting", unit="thing"))


def test_silent_when_stderr_is_not_a_terminal(monkeypatch, capfd):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert count_to_three() == [0, 1, 2]
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_a_bar_on_stderr_when_asked(monkeypatch, capfd):
    monkeypatch.setenv(ENV_VAR, "1")
    assert count_to_three() == [0, 1, 2]
    out, err = capfd.readouterr()
    assert out == ""
    assert "counting" in err and "3/3" in err and "thing" in err


def test_a_bar_on_a_terminal_unless_silenced(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    count_to_three()
    assert "3/3" in sys.stderr.getvalue()
    monkeypatch.setenv(ENV_VAR, "0")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert count_to_three() == [0, 1, 2]
    assert sys.stderr.getvalue() == ""


def test_short_work_shows_no_bar_even_when_asked(monkeypatch, capfd):
    monkeypatch.setenv(ENV_VAR, "1")
    assert list(progress(range(3), desc="counting", enabled=False)) == [0, 1, 2]
    assert capfd.readouterr().err == ""


def test_ingest_of_several_files_shows_a_bar(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv(ENV_VAR, "1")
    files = [make_job_file([make_result("naive", batch)]) for batch in (100, 1000, 10000)]
    engine = open_store(f"sqlite:///{tmp_path / 'results.sqlite'}")
    try:
        report = ingest_files(engine, write_results(tmp_path / "runs", files))
    finally:
        engine.dispose()
    assert (report.added, report.errors) == (3, [])
    err = capfd.readouterr().err
    assert "ingest" in err and "3/3" in err


def test_the_reference_forward_shows_its_images(monkeypatch, capfd):
    monkeypatch.setenv(ENV_VAR, "1")
    lenet = load_network(ROOT / "networks/lenet86.yaml")
    images = np.zeros((FORWARD_CHUNK + 6, *lenet.input_shape))
    assert reference_forward(lenet, load_weights(lenet), images).shape[0] == FORWARD_CHUNK + 6
    err = capfd.readouterr().err
    assert "float64 reference forward" in err and f"{FORWARD_CHUNK + 6}/{FORWARD_CHUNK + 6}" in err


def test_a_grid_job_shows_its_settings_and_keeps_its_log_lines(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv(ENV_VAR, "1")
    job = JobSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                  variants={"conv1": "naive", "conv2": "naive"},
                  grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64, 128, 256]}}],
                  batch=24, streams=1, host_memory="pageable", repeats=2, warmup=1, profiler="events",
                  sweep={"experiment": "t", "config_hash": "h", "config_path": "x.yaml"})
    run_job(job, tmp_path / "grid.json", backend=FAKE)
    out, err = capfd.readouterr()
    assert [line.split("]")[0] for line in out.splitlines() if line.startswith("[")] == ["[1/3", "[2/3", "[3/3"]
    assert f"job {job.job_id}" in err and "3/3" in err


def test_bench_shows_its_candidates(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv(ENV_VAR, "1")
    config = bench.load_bench_config(write(tmp_path, GOOD))
    total = sum(len(c) for c in config.candidates.values())
    logged = []
    bench.run_bench(config, bench.BenchOptions(batch=24, repeats=3), FAKE, load_torch=lambda: (None, "no torch"),
                    log=logged.append)
    err = capfd.readouterr().err
    assert "bench candidates" in err and f"{total}/{total}" in err
    assert any(line.startswith("conv1: ") for line in logged)


@pytest.mark.parametrize("module", ["convsweep.measure.job", "convsweep.base.progress"])
def test_progress_imports_tqdm_only_when_a_bar_is_made(module):
    import subprocess

    code = f"import sys, {module}; print('tqdm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
