"""Nsight Compute profile jobs on the CPU: what a launch's metrics say (the 'why' line), reading a
report through a stand-in for ncu_report, the job with no ncu and with a stand-in ncu (and child),
and the store on both backends. The real ncu runs in the gpu-marked tests."""
import json
import os
import stat
import sys

import pytest

from convsweep.measure import ncu as ncu_mod
from convsweep.sweep.config import JobSpec
from convsweep.base.errors import MachineError
from convsweep.measure.ncu import LaunchProfile, launch_metrics, profile_command, profiled_kernels, read_report, run_profile_job
from convsweep.analysis.query import run_query
from convsweep.store import ingest_files, ingest_result, open_store
from convsweep.model.variants import get_variant

from store_fixtures import as_reader, row_counts

SWEEP = {"experiment": "t", "config_hash": "h" * 64, "config_path": "x.yaml"}


def job(**over) -> JobSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"},
                grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64, 128]}}],
                batch=100, streams=1, host_memory="pageable", repeats=5, warmup=1, profiler="nsys", sweep=SWEEP)
    base.update(over)
    return JobSpec(**base)


def launch(**metrics) -> LaunchProfile:
    base = {key: None for key in ncu_mod.METRICS}
    base.update(metrics)
    return LaunchProfile(0, "conv2", "conv_forward", 0, base, [{"reason": "long_scoreboard", "share": 0.62},
                                                               {"reason": "wait", "share": 0.2}])


@pytest.mark.parametrize("metrics, expected", [
    (dict(dram_pct=91.4, sm_pct=40.0), "memory-bound: DRAM 91% of peak"),
    (dict(dram_pct=20.0, memory_pct=75.0, sm_pct=50.0), "memory-bound: L1/L2 75% of peak (DRAM 20%)"),
    (dict(dram_pct=10.0, sm_pct=88.0, tensor_pipe_pct=45.0), "compute-bound: SM 88% of peak, tensor pipe 45%"),
    (dict(dram_pct=10.0, sm_pct=30.0, achieved_occupancy_pct=24.6, waves_per_sm=3.0, blocks_limit_registers=2,
          blocks_limit_shared_mem=8, blocks_limit_warps=4, blocks_limit_sm=32),
     "latency: 25% occupancy, registers; stalls long_scoreboard 62%"),
    (dict(sm_pct=12.0, achieved_occupancy_pct=9.0, waves_per_sm=0.4),
     "latency: 0.40 waves: too few blocks to fill the GPU; 9% occupancy; stalls long_scoreboard 62%"),
])
def test_the_why_line_names_what_bounds_a_kernel(metrics, expected):
    assert launch(**metrics).bound == expected


class Metric:
    def __init__(self, value):
        self.value = value

    def as_double(self):
        if isinstance(self.value, str):
            raise TypeError("a string metric")
        return float(self.value)


class Domain:
    def __init__(self, name, ranges):
        self._name, self._ranges = name, ranges

    def name(self):
        return self._name

    def push_pop_ranges(self):
        return self._ranges


class NvtxState:
    def __init__(self, ranges):
        self._domains = {1: Domain("other", ["setting 9"]), 2: Domain("convsweep", ranges)}

    def domains(self):
        return list(self._domains)

    def domain_by_id(self, domain_id):
        return self._domains[domain_id]


class Action:
    """An ncu_report IAction: a name, metrics by name, the NVTX ranges open at its launch."""

    def __init__(self, name, ranges, metrics):
        self._name, self._ranges, self._metrics = name, ranges, metrics

    def name(self):
        return self._name

    def nvtx_state(self):
        return NvtxState(self._ranges)

    def metric_names(self):
        return list(self._metrics)

    def metric_by_name(self, name):
        return Metric(self._metrics[name]) if name in self._metrics else None


class Report:
    """ncu_report.load_report's context: one range of actions."""

    def __init__(self, actions):
        self.actions = actions

    def num_ranges(self):
        return 1

    def range_by_idx(self, i):
        return self

    def num_actions(self):
        return len(self.actions)

    def action_by_idx(self, i):
        return self.actions[i]


CONV2_METRICS = {
    "gpu__time_duration.sum": 191_000.0, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 91.0,
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": 35.0, "launch__registers_per_thread": 40,
    "launch__shared_mem_per_block_static": 1024, "launch__shared_mem_per_block_dynamic": 0,
    "dram__bytes_read.sum": 7.4e6, "dram__bytes_write.sum": 2.0e6, "lts__t_sector_hit_rate.pct": 55.0,
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 1000.0,
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 10.0,
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": 3.0,
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": 1.0,
    "launch__func_cache_config": "CachePreferNone",
}


def fake_report(monkeypatch):
    actions = [
        Action("conv_forward", ["setting 0", "repeat 0", "chunk 0", "conv1"], {"gpu__time_duration.sum": 82_000.0}),
        Action("conv_forward", ["setting 0", "repeat 0", "chunk 0", "conv2"], CONV2_METRICS),
        Action("conv_forward", ["setting 1", "repeat 0", "chunk 0", "conv2"], CONV2_METRICS),
        Action("conv_forward", ["setting 1", "repeat 0", "chunk 0", "conv2"], CONV2_METRICS),  # a second launch
        Action("maxpool2d", ["setting 0", "repeat 0", "chunk 0", "pool1"], {}),  # not a conv layer: left out
        Action("conv_forward", [], {}),  # outside the job's ranges: left out
    ]
    module = type("ncu_report", (), {"load_report": staticmethod(lambda path: Report(actions))})
    monkeypatch.setattr(ncu_mod, "import_ncu_report", lambda: module)


def test_a_report_is_read_launch_by_launch_with_its_setting_and_layer(monkeypatch, tmp_path):
    fake_report(monkeypatch)
    profiles = read_report(tmp_path / "r.ncu-rep", {"conv1", "conv2"})
    assert [(p.setting, p.layer, p.launch) for p in profiles] == [(0, "conv1", 0), (0, "conv2", 0), (1, "conv2", 0),
                                                                   (1, "conv2", 1)]
    conv2 = profiles[1]
    assert conv2.metrics["duration_ns"] == 191_000.0 and conv2.metrics["registers"] == 40
    assert conv2.metrics["flops"] == 2 * 1000 + 10  # an FMA is two
    assert conv2.metrics["l1_hit_pct"] is None  # not in the report: null, never guessed
    assert conv2.stalls == [{"reason": "long_scoreboard", "share": 0.75}, {"reason": "wait", "share": 0.25}]
    assert conv2.bound == "memory-bound: DRAM 91% of peak"
    metrics, stalls = launch_metrics(Action("k", [], {}))
    assert metrics["flops"] is None and stalls == []


def test_the_ncu_command_profiles_the_conv_kernels_only_with_nvtx(tmp_path):
    command = profile_command("/opt/ncu", tmp_path / "job", ["conv_forward", "im2col", "conv_forward"], ["python", "x"])
    assert command[:2] == ["/opt/ncu", "--nvtx"] and command[-2:] == ["python", "x"]
    assert command[command.index("--kernel-name") + 1] == "regex:^(conv_forward|im2col)$"
    assert "WarpStateStats" in command and "Occupancy" in command
    metrics = command[command.index("--metrics") + 1].split(",")  # what no section collects, the DRAM bytes
    assert {"dram__bytes_read.sum", "dram__bytes_write.sum", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"} <= set(metrics)
    assert command[command.index("--export") + 1] == str(tmp_path / "job")


def test_ncu_profiles_what_a_pass_launches_not_the_weights_preparation():
    """wgmma_fused_network's prepare_weights runs once at bind time, outside the conv layers' NVTX ranges:
    profiling it would cost a replay and give a profile no layer owns."""
    assert profiled_kernels(["wgmma_fused_network", "naive", "wgmma_fused_network"]) == ["network_forward", "conv_forward"]
    assert "prepare_weights" in get_variant("wgmma_fused_network").kernel_names  # loaded, just not profiled


def test_without_ncu_the_profile_job_fails_as_the_machines_and_writes_nothing(monkeypatch, tmp_path):
    """`ncu: true` asks for a tool the machine lacks: no result, the job fails until ncu is there."""
    monkeypatch.setenv("NCU", str(tmp_path / "nowhere" / "ncu"))  # a $NCU naming nothing is no ncu
    monkeypatch.setenv("PATH", str(tmp_path))  # and none on PATH
    out = tmp_path / "ncu" / "job.json"
    out.parent.mkdir()
    out.write_text("{}")  # an earlier run's file
    with pytest.raises(MachineError, match=r"^ncu: true asked for but ncu \(Nsight Compute\) is not on PATH or \$NCU$"):
        run_profile_job(job(), out)
    assert not out.exists()


def test_ncu_auto_without_ncu_is_a_skipped_profile_saying_so(monkeypatch, tmp_path):
    """`ncu: auto` (the default sweep's) profiles where ncu is found: elsewhere a skipped file says why, the
    job succeeds and ingest passes the reason on, so a machine with only the driver runs the default sweep."""
    monkeypatch.setenv("NCU", str(tmp_path / "nowhere" / "ncu"))
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "ncu" / "job.json"
    result = run_profile_job(job(), out, required=False)
    assert result["status"] == "skipped" and result["ncu"] is None
    assert result["reason"] == "ncu (Nsight Compute) is not on PATH or $NCU: not profiled (ncu: auto)"
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    engine = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    report = ingest_files(engine, [out])
    assert report.added == 0 and not report.errors and "ncu: auto" in report.skipped[0]
    engine.dispose()


FAKE_NCU = """#!{python}
# Stands in for ncu and the child it profiles: keeps the child's spec, writes the lines the child would
# have written, and the report file ncu would.
import json, shutil, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0 (build 1)")
    sys.exit(0)
export = args[args.index("--export") + 1]
child = args[args.index("--force-overwrite") + 3:]
print("==PROF== Connected to process", flush=True)
shutil.copy(child[child.index("--spec-file") + 1], export + ".child-spec.json")
with open(child[child.index("--out") + 1], "a") as out:
    out.write({child_lines!r})
print({message!r}, flush=True)
open(export + ".ncu-rep", "w").write("report")
sys.exit({exit_code})
"""


def fake_ncu(tmp_path, monkeypatch, exit_code=0, child_lines="", message=""):
    path = tmp_path / "bin" / "ncu"
    path.parent.mkdir()
    path.write_text(FAKE_NCU.format(python=sys.executable, exit_code=exit_code, child_lines=child_lines,
                                    message=message))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NCU", str(path))


def test_a_profile_job_runs_the_settings_once_under_ncu_and_stores_each_launch(monkeypatch, tmp_path, db_url):
    fake_ncu(tmp_path, monkeypatch)
    fake_report(monkeypatch)
    out = tmp_path / "results" / "t" / "ncu" / "job.json"
    spec = job()
    result = run_profile_job(spec, out)
    assert result["status"] == "ok", result["reason"]
    child = json.loads(out.with_suffix(".child-spec.json").read_text())  # every setting once, timed by events
    assert child["settings"] is None
    assert (child["job"]["repeats"], child["job"]["warmup"], child["job"]["profiler"]) == (1, 0, "events")
    assert result["ncu"] == "2099.1.0" and result["files"]["ncu_report"] == str(out.with_suffix(".ncu-rep"))
    assert len(result["profiles"]) == 4 and result["profiles"][1]["bound"] == "memory-bound: DRAM 91% of peak"
    assert [s["run_key"] for s in result["settings"]] == [run.run_key for run in spec.runs()]

    engine = open_store(db_url)
    try:
        assert ingest_result(engine, result, str(out)).added == 4
        assert ingest_result(engine, result, str(out)).unchanged == 4  # a file ingested twice is stored once
        assert row_counts(engine)["run"] == 0
    finally:
        engine.dispose()
    why = json.loads(run_query(as_reader(db_url), "why", fmt="json"))
    assert [(r["layer"], r["kernel"], json.loads(r["tunables"]) if isinstance(r["tunables"], str) else r["tunables"])
            for r in why] == [("conv1", "conv_forward", {"BLOCK": 64}), ("conv2", "conv_forward", {"BLOCK": 64}),
                              ("conv2", "conv_forward", {"BLOCK": 128})]
    conv2 = why[1]
    assert conv2["why"] == "memory-bound: DRAM 91% of peak" and conv2["ncu time (ms)"] == pytest.approx(0.191)
    assert conv2["smem/block"] == 1024 and conv2["DRAM bytes"] == 9_400_000 and conv2["variant"] == "naive"

    # Profiled again (a new profile file, later): its rows are the setting's evidence, the old ones stay stored.
    again = json.loads(json.dumps(result))
    again.update(profile_id="f" * 32, started_at="2999-01-01T00:00:00.000+00:00")
    for profile in again["profiles"]:
        profile["metrics"]["duration_ns"] *= 2
    engine = open_store(db_url)
    try:
        assert ingest_result(engine, again, str(out)).added == 4
    finally:
        engine.dispose()
    assert len(json.loads(run_query(as_reader(db_url), "SELECT id FROM kernel_profile", fmt="json"))) == 8
    newest = json.loads(run_query(as_reader(db_url), "why", fmt="json"))
    assert len(newest) == 3 and newest[1]["ncu time (ms)"] == pytest.approx(2 * 0.191)


def test_ncu_failing_skips_the_profile_with_its_words(monkeypatch, tmp_path):
    fake_ncu(tmp_path, monkeypatch, exit_code=1)
    result = run_profile_job(job(), tmp_path / "ncu" / "job.json")
    assert result["status"] == "skipped" and result["reason"].startswith("ncu exited with 1")


def test_a_gpu_whose_counters_may_not_be_read_is_a_skipped_profile_stored_with_the_reason(monkeypatch, tmp_path):
    """Unlike a missing ncu, this is a fact about this GPU's settings: a file says so, ingest passes it on."""
    fake_ncu(tmp_path, monkeypatch, exit_code=1, message="==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                                                         "permission to access NVIDIA GPU Performance Counters")
    out = tmp_path / "ncu" / "job.json"
    result = run_profile_job(job(), out)
    assert result["status"] == "skipped" and "ERR_NVGPUCTRPERM" in result["reason"]
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [s["params"]["conv1"]["BLOCK"] for s in result["settings"]] == [64, 128]
    engine = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    report = ingest_files(engine, [out])
    assert report.added == 0 and not report.errors and "ERR_NVGPUCTRPERM" in report.skipped[0]
    assert row_counts(engine)["run"] == 0
    engine.dispose()


def test_a_child_that_cannot_open_a_gpu_fails_the_profile_job_as_the_machines(monkeypatch, tmp_path):
    """ncu by itself would only say it saw no kernel; the child says why, and the job fails with its line."""
    fake_ncu(tmp_path, monkeypatch, child_lines=json.dumps({"machine": "no NVIDIA GPU or driver on this machine "
                                                                       "(cuInit: CUDA_ERROR_NO_DEVICE)"}) + "\n")
    out = tmp_path / "ncu" / "job.json"
    with pytest.raises(MachineError) as caught:
        run_profile_job(job(), out)
    assert str(caught.value) == "no NVIDIA GPU or driver on this machine (cuInit: CUDA_ERROR_NO_DEVICE)"
    assert not out.exists()


def test_the_profile_schema_names_a_bad_key(tmp_path):
    from convsweep.base.errors import StoreError

    engine = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    bad = {"format": "ncu-1", "profile_id": "p", "job_id": "j", "job_key": "k", "sweep": SWEEP, "status": "ok",
           "settings": [], "profiles": [{"setting": 0}]}
    with pytest.raises(StoreError, match=r"profiles\[0\]"):
        ingest_result(engine, bad, "bad.json")
    engine.dispose()
    assert os.path.exists(tmp_path / "db.sqlite")


def test_the_report_reader_is_found_beside_ncu_or_from_the_toolkits_launcher(tmp_path):
    def install(root):
        (root / "extras" / "python").mkdir(parents=True)
        (root / "extras" / "python" / "ncu_report.py").write_text("")
        (root / "ncu").write_text("#!/bin/sh\n")
        return root / "extras" / "python"

    # NVIDIA's own install, reached through a symlink on PATH
    own = install(tmp_path / "opt" / "2025.3.1")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ncu").symlink_to(tmp_path / "opt" / "2025.3.1" / "ncu")
    assert ncu_mod.ncu_report_dirs(str(tmp_path / "bin" / "ncu"), opt=tmp_path / "none") == [own]
    # the CUDA toolkit: bin/ncu is a launcher script; the reader is in ../nsight-compute-<version>
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "ncu").write_text("#!/bin/sh\nexec ../nsight-compute-2025.3.1/ncu \"$@\"\n")
    toolkit_new, toolkit_old = install(cuda / "nsight-compute-2025.3.1"), install(cuda / "nsight-compute-2024.1.0")
    found = ncu_mod.ncu_report_dirs(str(cuda / "bin" / "ncu"), opt=tmp_path / "opt")
    assert found == [toolkit_new, toolkit_old, own]
    # no reader anywhere
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    (tmp_path / "bare" / "bin" / "ncu").write_text("#!/bin/sh\n")
    assert ncu_mod.ncu_report_dirs(str(tmp_path / "bare" / "bin" / "ncu"), opt=tmp_path / "none") == []


NCU_THAT_HANGS = """
import os, sys, time
print("==PROF== Connected to process", flush=True)
fd = os.open(os.environ["CONVSWEEP_HEARTBEAT"], os.O_WRONLY | os.O_APPEND)
os.write(fd, b"setting 0\\npass \\n")
if sys.argv[1] == "hang":
    time.sleep(60)
print("==ERROR== it broke", flush=True)
"""


def test_a_pass_that_never_ends_under_ncu_is_killed_and_the_profile_says_why(tmp_path):
    """A kernel that hangs would hold the GPU under ncu for good: its pass is held to the experiment's deadline times
    NCU_DEADLINE_FACTOR, and ncu's lines still reach the log."""
    import io
    import time

    script = tmp_path / "ncu.py"
    script.write_text(NCU_THAT_HANGS)
    log = io.StringIO()
    started = time.monotonic()
    problem = ncu_mod._run_ncu([sys.executable, str(script), "hang"], log, deadline_s=0.05)
    assert time.monotonic() - started < 10
    assert problem == (f"a pass ran past {0.05 * ncu_mod.NCU_DEADLINE_FACTOR:g} s under Nsight Compute "
                       f"({ncu_mod.NCU_DEADLINE_FACTOR}x the 0.05 s deadline): ncu was killed, not profiled")
    assert "==PROF== Connected to process" in log.getvalue()
    assert ncu_mod._run_ncu([sys.executable, str(script), "finish"], io.StringIO(), 300) == \
        "ncu exited with 0: it broke"
