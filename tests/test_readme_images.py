"""scripts/readme_images.py on the CPU, over stores built from the fixtures: it refuses in one line, drawing
nothing, a store without an ok GPU run of every variant and batch of the default experiment, and a bench file
of another GPU; given them all, it draws README's figures with `convsweep plot`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from convsweep.sweep.config import expand_config, load_config, variant_label
from convsweep.base.paths import ROOT
from convsweep.store import ingest_result, open_store
from convsweep.model.variants import load_registry
from store_fixtures import make_result

SCRIPT = ROOT / "scripts" / "readme_images.py"
EXPERIMENT = "lenet86-baseline"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def default_gpu_runs() -> list[tuple[str, int]]:
    """(variant, batch) of every GPU job of the default experiment, read from experiments.yaml."""
    registry = load_registry()
    jobs = expand_config(load_config(ROOT / "experiments.yaml"))
    return sorted({(variant_label(j.variants), j.batch) for j in jobs if j.experiment == EXPERIMENT
                   and not all(registry[v].is_cpu for v in j.variants.values())})


def store(path: Path, runs: list[tuple[str, int]]) -> Path:
    engine = open_store(f"sqlite:///{path}")
    for index, (variant, batch) in enumerate(runs):
        ingest_result(engine, make_result(variant, batch, op_time_ms=(0.1 + index, 0.2 + index)), None)
    engine.dispose()
    return path


def readme_images(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_the_default_experiment_has_gpu_variants_to_show():
    runs = default_gpu_runs()
    assert {"naive", "wgmma_fused_network"} <= {v for v, _ in runs} and "reference" not in {v for v, _ in runs}


def test_a_store_without_every_default_variant_is_refused_in_one_line(tmp_path):
    runs = [run for run in default_gpu_runs() if run[0] != "wgmma_fused_network"]
    db = store(tmp_path / "results.sqlite", runs + [("wgmma_fused_network", 100)])
    out = tmp_path / "img"
    proc = readme_images("--db", str(db), "--out", str(out))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"readme_images: {db} lacks ok GPU runs of the default sweep's {EXPERIMENT}: "
                                  "wgmma_fused_network (batch 1000, 10000)")
    assert not out.exists()


def test_failed_runs_do_not_count(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 'results.sqlite'}")
    for variant, batch in default_gpu_runs():
        ingest_result(engine, make_result(variant, batch, status="ok" if variant != "naive" else "failed"), None)
    engine.dispose()
    proc = readme_images("--db", str(tmp_path / "results.sqlite"), "--out", str(tmp_path / "img"))
    assert proc.returncode == 2 and "lacks ok GPU runs" in proc.stderr and "naive (batch 100, 1000, 10000)" in proc.stderr


def test_a_missing_store_is_one_line(tmp_path):
    proc = readme_images("--db", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "img"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"readme_images: {tmp_path / 'none.sqlite'}: no such store")
    assert not (tmp_path / "none.sqlite").exists()


def test_a_bench_file_of_another_gpu_is_refused(tmp_path):
    db = store(tmp_path / "results.sqlite", default_gpu_runs())
    bench = json.loads((ROOT / "docs" / "bench-h100.json").read_text(encoding="utf-8"))
    bench["device"] = "NVIDIA H200"
    (tmp_path / "bench.json").write_text(json.dumps(bench), encoding="utf-8")
    proc = readme_images("--db", str(db), "--bench", str(tmp_path / "bench.json"), "--out", str(tmp_path / "img"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "measured on NVIDIA H200, the runs on NVIDIA H100 80GB HBM3" in proc.stderr
    assert not (tmp_path / "img").exists()


def test_a_store_of_the_whole_default_experiment_draws_readmes_figures(tmp_path):
    pytest.importorskip("matplotlib", minversion="3.8", reason="figures need matplotlib (a dependency of convsweep)")
    db = store(tmp_path / "results.sqlite", default_gpu_runs())
    out = tmp_path / "img"
    proc = readme_images("--db", str(db), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / "op-time.png"), str(out / "roofline.png")]
    for name in ("op-time.png", "roofline.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)


def test_readme_shows_the_figures_the_script_draws():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/img/op-time.png)" in readme and "](docs/img/roofline.png)" in readme
    assert "python scripts/readme_images.py" in readme
