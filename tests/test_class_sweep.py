"""A class's sweep (`submissions: DIR`, docs/course.md "Running a class"): every variant of every submission that
passes the check becomes jobs of its own, one per batch, so no two submissions share a process; a submission that
fails is left out with its reason, told by the plan, its record and the report; a job given its spec alone finds
and builds its own submission's checked copy; the specs of sweeps without a class keep their ids; and a class of
300 submissions at 3 batches is planned by `snakemake -n` in seconds."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from convsweep.base.errors import ConfigError
from convsweep.base.paths import KERNELS_DIR, ROOT
from convsweep.sweep.classes import LEFT_OUT_FILE, LeftOut
from convsweep.sweep.config import expand, expand_config, load_config

NAIVE = (KERNELS_DIR / "naive.cu").read_text()
TILED = (KERNELS_DIR / "tiled_shared.cu").read_text()
NAIVE_ENTRY = """\
{name}:
  source: {source}
  precision: fp32
  description: the naive kernel, handed in by {sid}
  params:
    BLOCK: {{default: 256, values: [128, 256]}}
  constraints: ["{constraint}"]
  launches:
    - kernel: conv_forward
      grid: ["B * ceil(H_out * W_out / BLOCK)", M, 1]
      block: [BLOCK, 1, 1]
"""
TILED_ENTRY = """\
tiled:
  source: tiled.cu
  precision: fp32
  description: the tiled kernel, handed in
  params:
    TILE_W: {default: 16, values: [8, 16]}
    TILE_H: {default: 8, values: [8]}
  constraints: ["E * (((TILE_H - 1) * S + K) * ((TILE_W - 1) * S + K) + K * K) <= 49152"]
  launches:
    - kernel: conv_forward
      grid: ["B * ceil(W_out / TILE_W) * ceil(H_out / TILE_H)", M, 1]
      block: [TILE_W, TILE_H, 1]
      shared_bytes: "E * (((TILE_H - 1) * S + K) * ((TILE_W - 1) * S + K) + K * K)"
"""
BATCHES = [100, 1000, 10000]
SNAKEMAKE = shutil.which("snakemake")


def submission(parent: Path, sid: str, files: dict[str, str], registry: str) -> Path:
    folder = parent / sid
    for rel, text in {**files, "variants.yaml": registry}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def naive(parent: Path, sid: str, constraint: str = "M <= 65535") -> Path:
    """An honest submission: the shipped naive kernel, handed in as mine.cu (variant `mine`)."""
    return submission(parent, sid, {"mine.cu": NAIVE},
                      NAIVE_ENTRY.format(name="mine", source="mine.cu", sid=sid, constraint=constraint))


@pytest.fixture
def klass(tmp_path) -> Path:
    """A class: alice hands in two variants (naive and tiled), bob-2 one, mallory one that includes a file outside
    its folder; a roster beside them is passed over."""
    folder = tmp_path / "submissions"
    submission(folder, "alice", {"mine.cu": NAIVE, "tiled.cu": TILED},
               NAIVE_ENTRY.format(name="mine", source="mine.cu", sid="alice", constraint="M <= 65535") + TILED_ENTRY)
    naive(folder, "bob-2")
    submission(folder, "mallory", {"mine.cu": '#include "../alice/mine.cu"\n'},
               NAIVE_ENTRY.format(name="mine", source="mine.cu", sid="mallory", constraint="M <= 65535"))
    (folder / "roster.txt").write_text("alice\nbob-2\nmallory\n")
    return folder


def sweep(folder: Path, **experiment) -> dict:
    return {"experiments": {"class": {"submissions": str(folder), "batches": BATCHES, **experiment}}}


def write_sweep(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "class.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_each_variant_of_each_submission_is_a_job_per_batch_and_the_bad_one_is_left_out(klass, tmp_path):
    jobs, left_out = expand(load_config(write_sweep(tmp_path, sweep(klass))))
    assert sorted((job.label, job.batch) for job in jobs) == sorted(
        (name, batch) for name in ("alice__mine", "alice__tiled", "bob_2__mine") for batch in BATCHES)
    assert len({job.job_id for job in jobs}) == 9
    for job in jobs:  # one submission's one variant on every conv layer, at its registry's defaults
        assert set(job.variants) == {"conv1", "conv2"} and len(set(job.variants.values())) == 1
        assert job.submissions == str(klass) and job.to_dict()["submissions"] == str(klass)
        assert job.settings().chosen in ([{"conv1": {"BLOCK": 256}, "conv2": {"BLOCK": 256}}],
                                         [{"conv1": {"TILE_W": 16, "TILE_H": 8}, "conv2": {"TILE_W": 16, "TILE_H": 8}}])
    assert list(left_out) == ["class"]
    left = left_out["class"]
    assert left.folder == str(klass) and left.planned == 2
    assert left.submissions == ((
        "mallory", f"{klass}/mallory/mine.cu:1: #include \"../alice/mine.cu\": leaves the submission's folder ('..')"),)


def test_params_name_a_submissions_variant_and_the_others_keep_their_defaults(klass, tmp_path):
    jobs = expand_config(load_config(write_sweep(tmp_path, sweep(klass, params={"bob_2__mine": {"BLOCK": [128, 256]},
                                                                                "mallory__mine": {"BLOCK": [128]}}))))
    settings = {job.label: [s["conv1"] for s in job.settings().chosen] for job in jobs}
    assert settings["bob_2__mine"] == [{"BLOCK": 128}, {"BLOCK": 256}]
    assert settings["alice__mine"] == [{"BLOCK": 256}]  # mallory's params are passed over: it is left out
    with pytest.raises(ConfigError, match=r"params\.bob_2__mine\.BLOCK: 512 is not an allowed value"):
        expand_config(load_config(write_sweep(tmp_path, sweep(klass, params={"bob_2__mine": {"BLOCK": [512]}}))))


def test_a_submission_the_network_does_not_fit_is_left_out_and_a_shipped_baseline_keeps_its_ids(klass, tmp_path):
    naive(klass, "carol", constraint="M <= 2")  # LeNet-86's conv layers have more output maps
    jobs, left_out = expand(load_config(write_sweep(tmp_path, sweep(klass, variants=["naive"]))))
    reasons = dict(left_out["class"].submissions)
    assert sorted(reasons) == ["carol", "mallory"]
    assert reasons["carol"].startswith(f"{klass}/carol/variants.yaml: mine: ") and "needs M <= 2" in reasons["carol"]
    assert not any(job.label.startswith("carol") for job in jobs)
    baseline = [job for job in jobs if job.label == "naive"]
    alone = expand_config({"experiments": {"class": {"variants": ["naive"], "batches": BATCHES}}})
    assert [job.job_id for job in baseline] == [job.job_id for job in alone]  # no class in a shipped variant's spec
    assert all(job.submissions is None and "submissions" not in job.to_dict() for job in baseline)


# Job ids of a sweep without a class, as the code before classes gave them (a changed id re-measures the job).
PINNED = {"naive-b100-s1-pageable-bfb5eb0a3c", "naive-b1000-s1-pageable-9647079e2b",
          "reference-b100-s1-pageable-b552853247", "reference-b1000-s1-pageable-5090a2147f",
          "mixed-b10000-s1-pinned-41f6b6d3d9", "mixed-b10000-s4-pinned-d83e694cee"}


def test_job_ids_of_sweeps_without_a_class_are_unchanged():
    jobs = expand_config({"experiments": {
        "e1": {"network": "networks/lenet86.yaml", "variants": ["naive", "reference"], "batches": [100, 1000],
               "params": {"naive": {"BLOCK": [128, 512]}}},
        "e2": {"variants": [{"conv1": "naive", "conv2": "tiled_shared"}], "batches": [10000], "streams": [1, 4],
               "host_memory": ["pinned"]}}})
    assert {job.job_id for job in jobs} == PINNED
    assert all("submissions" not in run.to_dict() for job in jobs for run in job.runs())


def test_an_experiment_names_variants_or_submissions(tmp_path):
    with pytest.raises(ConfigError, match=r"experiments\.e: expected a variants list or a submissions folder"):
        load_config(write_sweep(tmp_path, {"experiments": {"e": {"batches": [100]}}}))
    for folder, said in ((tmp_path / "none", "expected a folder of submissions"),
                         (tmp_path, "holds no submission folder")):
        with pytest.raises(ConfigError, match=rf"class\.yaml:\d+: experiments\.class\.submissions: .*{said}"):
            expand_config(load_config(write_sweep(tmp_path, sweep(folder))))


RESOLVE = """\
import json, sys
from convsweep.app.commands.common import job_spec
from convsweep.base.errors import ConvsweepError
from convsweep.device.compile import compile_variant
from convsweep.model.variants import get_variant

spec = job_spec(json.loads(open(sys.argv[1]).read()))
name = spec.variants["conv1"]
try:
    variant = get_variant(name)
except ConvsweepError as e:
    print(json.dumps({"error": str(e)}))
    raise SystemExit(0)
built = compile_variant(variant, variant.defaults(), "sm_90a")
print(json.dumps({"name": variant.name, "source": str(variant.source), "kernels": [k.name for k in built.kernels],
                  "settings": spec.settings().chosen}))
"""


def resolve_in_a_fresh_process(spec: dict, tmp_path: Path, cache: Path) -> dict:
    """What `get_variant` gives a job's process, given the spec alone (and NVRTC's build of it)."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-c", RESOLVE, str(spec_file)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "CONVSWEEP_CACHE": str(cache)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_job_given_its_spec_alone_reads_and_builds_its_own_submission(klass, tmp_path):
    from convsweep.app.commands.common import job_spec

    job = next(job for job in expand_config(load_config(write_sweep(tmp_path, sweep(klass))))
               if job.label == "bob_2__mine" and job.batch == 100)
    spec = {**job.to_dict(), "sweep": job.sweep, "job_id": job.job_id}
    assert job_spec(json.loads(json.dumps(spec))) == job  # the spec round-trips, its id with it
    cache = tmp_path / "job-cache"
    found = resolve_in_a_fresh_process(spec, tmp_path, cache)
    assert found["name"] == "bob_2__mine" and found["kernels"] == ["conv_forward"]
    assert found["settings"] == [{"conv1": {"BLOCK": 256}, "conv2": {"BLOCK": 256}}]
    # NVRTC built the checked copy, beside the shipped headers; no other submission was read or copied.
    source = Path(found["source"])
    assert source.parent.parent == cache / "submissions" and source.parent.name.startswith("bob-2-")
    assert [p.name for p in (cache / "submissions").iterdir()] == [source.parent.name]
    assert source.read_text() == NAIVE and (source.parent / "common.cuh").is_file()
    # A file changed since the plan is checked again in the job: never built unchecked.
    (klass / "bob-2" / "mine.cu").write_text('#include "/etc/passwd"\n' + NAIVE)
    said = resolve_in_a_fresh_process(spec, tmp_path, cache)["error"]
    assert said.startswith("variant 'bob_2__mine': submission bob-2 cannot be used: ") and "an absolute path" in said


def test_the_plan_records_tells_and_reports_the_submissions_left_out(klass, tmp_path, monkeypatch, capsys):
    from convsweep.app.plan import SweepPlan
    from convsweep.report.coverage import read_coverage, section

    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, sweep(klass))
    plan = SweepPlan(yaml.safe_load(path.read_text()), path)
    assert plan.winner_groups("class") == []  # a class's jobs are never confirmed together, in one process
    job = next(job for job in plan.jobs if job.label == "alice__tiled")
    sources = plan.job_sources("class", job.job_id)
    assert any(s.endswith("/tiled.cu") and "/submissions/alice-" in s for s in sources), sources
    assert not any("bob-2" in s or "mallory" in s for s in sources)
    assert plan.gpus("class", job.job_id) == 1
    assert plan.registry_entries("class", job.job_id).startswith("alice__tiled=")
    plan.write_not_run()
    record = tmp_path / "results" / "class" / LEFT_OUT_FILE
    assert LeftOut.read(record) == plan.submissions_left_out["class"]
    plan.submissions_left_out.tell(plan.experiments)
    told = capsys.readouterr().err.splitlines()
    assert told[0] == (f"convsweep: class: 1 submission of {klass} left out, not planned (2 planned): it fails the "
                       f"check (`convsweep submissions check {klass}` says the same)")
    assert told[1].startswith(f"  mallory: {klass}/mallory/mine.cu:1: #include")
    blocks = section(read_coverage(record.parent, []), [], "in the failures table")
    table = next(block for block in blocks if type(block).__name__ == "Table")
    assert table.headers == ["submission", "why"] and table.rows[0][0] == "mallory"
    # Fixed, the submission is planned, and its old record is removed.
    (klass / "mallory" / "mine.cu").write_text(NAIVE)
    fixed = SweepPlan(yaml.safe_load(path.read_text()), path)
    assert any(job.label == "mallory__mine" for job in fixed.jobs) and not fixed.submissions_left_out
    fixed.write_not_run()
    assert not record.exists()


def test_the_example_class_sweep_plans_its_two_honest_submissions():
    jobs, left_out = expand(load_config(ROOT / "sweeps" / "class.yaml"))
    assert sorted({job.label for job in jobs}) == ["jdoe2__naive", "jdoe2__tiled", "team_7__unrolled"]
    assert [sid for sid, _ in left_out["class"].submissions] == ["eve"]


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_planning_a_class_of_300_submissions_at_3_batches_takes_seconds(tmp_path):
    folder = tmp_path / "submissions"
    for i in range(300):  # each registry its own text: no check is remembered from another
        naive(folder, f"s{i:03d}")
    path = write_sweep(tmp_path, sweep(folder))
    env = {**os.environ, "CONVSWEEP_GPU_JOBS": "run", "CONVSWEEP_CACHE": str(tmp_path / "cache")}  # GPU jobs planned
    started = time.perf_counter()
    done = subprocess.run([SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores",
                           "1", "-n", "--configfile", str(path)], capture_output=True, text=True, env=env, timeout=600)
    took = time.perf_counter() - started
    print(f"snakemake -n over 300 submissions x 3 batches (900 jobs): {took:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {tuple(line.split()) for line in (done.stdout + done.stderr).splitlines()
            if line.startswith("run_job ")} == {("run_job", "900")}  # Snakemake's job stats
    assert took < 60, f"planning 900 jobs took {took:.1f} s"
