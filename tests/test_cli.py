"""The command line: one clear line for bad input, exit status 2, nothing half-written."""
import json
import subprocess
import sys
import time

import pytest

from convsweep.sweep.config import ROOT, JobSpec, RunSpec

RESOLUTION_S = 0.02  # process_age: /proc/uptime and the start time each count in 1/100 s


def convsweep(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "convsweep.app.cli", *args], capture_output=True, text=True, cwd=cwd)


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("convsweep: ")
    return lines[0]


def test_jobs_lists_the_default_matrix():
    proc = convsweep("jobs", "--config", str(ROOT / "experiments.yaml"))
    assert proc.returncode == 0
    lines = proc.stdout.strip().splitlines()
    # lenet86-baseline: seven variants at three batches; lenet86-cache: four GPU variants at batch 100, warm and
    # cold; lenet86-input: the fused network at three batches, shipped in four formats
    assert sum(line.startswith("lenet86-baseline\t") for line in lines) == 21
    assert sum(line.startswith("lenet86-cache\t") for line in lines) == 8
    assert sum(line.startswith("lenet86-input\t") for line in lines) == 12 and sum("-u8-source-" in line for line in lines) == 3
    assert sum("-cold-" in line for line in lines) == 4 and len(lines) == 41
    specs = [json.loads(line) for line in convsweep("jobs", "--json", "--config", str(ROOT / "experiments.yaml")).stdout.splitlines()]
    fused = [spec for spec in specs if "fp16_fused_network" in spec["variants"].values()]
    assert [spec["variants"] for spec in fused] == [{"conv1": "fp16_fused_network"}] * 15  # conv1's kernel computes conv2 too


def test_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "experiments.yaml"
    bad.write_text("experiments:\n  e:\n    variants: [naive]\n    batches: [100]\n    streamz: [1]\n")
    line = one_error_line(convsweep("jobs", "--config", str(bad)))
    assert str(bad) in line and "experiments.e" in line and "streamz" in line


def test_unknown_variant_and_tunable_are_one_line():
    assert "unknown variant 'nope'" in one_error_line(convsweep("compile", "nope", "--arch", "sm_90"))
    assert "has no tunable 'TILE'" in one_error_line(convsweep("compile", "naive", "--param", "TILE=8", "--arch", "sm_90"))


def test_compile_prints_resources_and_writes_the_build(tmp_path):
    out = tmp_path / "b.json"
    proc = convsweep("compile", "naive", "--param", "BLOCK=128", "--arch", "sm_90", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "conv_forward" in proc.stdout and "regs" in proc.stdout
    build = json.loads(out.read_text())["builds"][0]
    assert build["params"] == {"BLOCK": 128} and build["kernels"][0]["registers"] > 0


def test_query_without_a_database_is_one_line(tmp_path):
    line = one_error_line(convsweep("query", "summary", "--db", f"sqlite:///{tmp_path}/none.sqlite"))
    assert "none.sqlite" in line


def test_unreachable_database_is_one_line(tmp_path):
    result = tmp_path / "r.json"
    result.write_text("{}")
    line = one_error_line(convsweep("ingest", "--db", "postgresql+psycopg://u@127.0.0.1:1/x", str(result)))
    assert "unreachable" in line


def test_run_job_with_a_broken_spec_is_one_line(tmp_path):
    line = one_error_line(convsweep("run-job", "--spec", "{not json", "--out", str(tmp_path / "r.json")))
    assert "--spec" in line
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("flag", ["--verbose", "-v"])
def test_verbose_shows_the_traceback(flag):
    proc = convsweep(flag, "compile", "nope", "--arch", "sm_90")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_a_shape_fixing_variant_compiles_for_the_layers_of_a_network_or_the_given_shape(tmp_path):
    proc = convsweep("compile", "restrict_unroll", "--arch", "sm_90")  # LeNet-86's two convs
    assert proc.returncode == 0, proc.stderr
    assert '"C_FIXED": 1' in proc.stdout and '"C_FIXED": 4' in proc.stdout
    proc = convsweep("compile", "restrict_unroll", "--arch", "sm_90", "--define", "C_FIXED=4", "--define", "K_FIXED=7",
                     "--define", "S_FIXED=1")
    assert proc.returncode == 0 and "conv_forward" in proc.stdout, proc.stderr
    # A network none of whose layers it fits: say how to give the shape
    line = one_error_line(convsweep("compile", "tf32_sliding_window", "--arch", "sm_90", "--network",
                                    "networks/fp64_stride5.yaml"))
    assert "does not fit any conv layer of networks/fp64_stride5.yaml" in line and "--define C_FIXED=..." in line
    proc = convsweep("compile", "restrict_unroll", "--arch", "sm_90", "--layer", "conv2")  # one layer's shape
    assert proc.returncode == 0 and '"C_FIXED": 4' in proc.stdout and '"C_FIXED": 1' not in proc.stdout, proc.stderr


def test_compile_all_on_a_network_lists_what_it_could_not_build(tmp_path):
    """`compile all` builds what it can for the network's shapes and names, with the way out, what needs a shape."""
    out = tmp_path / "all.json"
    proc = convsweep("compile", "all", "--arch", "sm_90a", "--network", "networks/fp64_stride5.yaml", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    unbuilt = [line for line in proc.stdout.splitlines() if "not built" in line]
    assert unbuilt and all("--define" in line for line in unbuilt)
    assert any(line.startswith("tf32_sliding_window: not built") for line in unbuilt)
    assert json.loads(out.read_text())["builds"]  # the variants that take any shape were built


def test_help_lists_every_command_and_every_option_has_help():
    from convsweep.app.cli import build_parser

    top = convsweep("--help").stdout
    assert "SUPPRESS" not in top and "measure" not in top  # the nsys inner half is not a user command
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in commands.items():
        for action in sub._actions:
            assert action.help, f"convsweep {name} {'/'.join(action.option_strings) or action.dest}: no help text"


def test_compare_help_prints_each_percent_once():
    """argparse %-formats a help= string, but a description only when it holds %(prog): compare's said `95%%`."""
    proc = convsweep("compare", "--help")
    assert proc.returncode == 0
    said = " ".join(proc.stdout.split())
    assert "a 95% bootstrap interval" in said and "%%" not in said


def test_compile_all_builds_every_variant_for_the_gpus_own_target_and_says_which_another_target_rules_out(tmp_path):
    from convsweep.model.variants import load_registry

    gpu_variants = {name for name, var in load_registry().items() if not var.is_cpu}
    out = tmp_path / "all.json"
    proc = convsweep("compile", "all", "--out", str(out))  # auto, without a GPU: the lent H100's sm_90a
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["arch"] == "sm_90a"
    assert {b["variant"] for b in json.loads(out.read_text())["builds"]} == gpu_variants
    proc = convsweep("compile", "all", "--arch", "sm_90", "--out", str(out))  # plain sm_90 has no wgmma
    assert proc.returncode == 0, proc.stderr
    needs = {name for name, var in load_registry().items() if var.arch and "sm_90" not in var.arch}
    assert needs and {b["variant"] for b in json.loads(out.read_text())["builds"]} == gpu_variants - needs
    assert all(f"{name}: not built: needs sm_90a (registry arch), not sm_90" in proc.stdout for name in needs)


def test_process_age_is_small_for_a_new_process_and_grows(tmp_path):
    """Never more than the parent saw the process run, with a process name (/proc/self/stat's
    `comm`) that holds spaces and parentheses."""
    python = tmp_path / "py (1) x"
    python.symlink_to(sys.executable)
    code = "import time; from convsweep.app.cliargs import process_age; a = process_age(); time.sleep(0.2); print(a, process_age())"
    t = time.perf_counter()
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr
    first, last = map(float, proc.stdout.split())
    assert 0 <= first < last <= wall + RESOLUTION_S
    assert 0.2 - RESOLUTION_S <= last - first <= wall


def test_run_job_times_the_whole_process(tmp_path):
    """An events job (the CPU reference variant) run as Snakemake runs it: process_start survives
    the measured phases, and total_s covers them all but not more than the process's wall time."""
    job = JobSpec.for_run(RunSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                                  variants={"conv1": "reference", "conv2": "reference"},
                                  params={"conv1": {}, "conv2": {}}, batch=8, streams=1, host_memory="pageable",
                                  repeats=1, warmup=0, profiler="events"))
    out = tmp_path / "r.json"
    t = time.perf_counter()
    proc = convsweep("run-job", "--spec", json.dumps({**job.to_dict(), "sweep": job.sweep}), "--out", str(out))
    wall = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith(f"{job.job_id}: 1 settings in ")
    assert "1 ok; fastest: conv1 " in proc.stdout
    job_result = json.loads(out.read_text())
    result = job_result["measurements"][0]
    assert result["status"] == "ok", result["error"]
    phases = result["phases_s"]
    assert {"process_start", "load", "warmup", "timed", "check"} <= set(phases)
    assert 0 < phases["process_start"] < wall
    assert sum(phases.values()) <= result["timings"]["total_s"] <= wall + RESOLUTION_S
    assert result["timings"]["total_s"] == pytest.approx(job_result["total_s"])  # the job's one setting: all of it


def test_ingest_names_each_bad_file_stores_the_good_ones_and_fails_at_the_end(tmp_path):
    from store_fixtures import make_result, write_results

    good = write_results(tmp_path / "runs", [make_result("naive", 100), make_result("tiled", 100)])
    bad = tmp_path / "runs" / "half.json"
    bad.write_text('{"format": 2, "job_')
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    proc = convsweep("ingest", "--db", db, "--report", str(tmp_path / "ingested.json"), str(good[0]), str(bad), str(good[1]))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"convsweep: {bad}: not valid JSON: Unterminated string starting at: line 1 "
                                        "column 15 (char 14)"]
    assert "2 added, 0 already stored, 1 could not be stored" in proc.stdout
    assert not (tmp_path / "ingested.json").exists()  # the Snakemake rule's output: only when all stored
    again = convsweep("ingest", "--db", db, *map(str, good))
    assert again.returncode == 0 and "0 added, 2 already stored" in again.stdout


def test_a_sweep_stops_before_any_job_when_the_database_is_unusable(tmp_path):
    """A database that cannot take results stops Snakemake with one line before any job runs, so
    no GPU time is spent on results that could not be stored."""
    import shutil

    import yaml

    snakemake = shutil.which("snakemake")
    if snakemake is None:
        pytest.skip("snakemake is not installed")
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "results.sqlite").write_text("not a database")
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump({"experiments": {"e": {
        "variants": ["reference"], "batches": [8], "repeats": 1, "warmup": 0, "profiler": "events"}}}))
    proc = subprocess.run([snakemake, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
                           "--cores", "1"], capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "convsweep: db/results.sqlite is not an SQLite database (file is not a database)" in out, out[-2000:]
    assert not (tmp_path / "results" / "e" / "runs").exists()


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`convsweep ... | head`: the closed pipe ends the command with a shell's SIGPIPE status, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "convsweep.app.cli", "query", "--list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before it writes: its first write meets a pipe nobody reads
    assert proc.stderr.read() == ""
    assert proc.wait(timeout=60) == 141


def test_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    import errno

    from convsweep.app import cli
    from convsweep.measure import job

    def full_disk(spec, out, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(job, "run_job", full_disk)
    spec = JobSpec.for_run(RunSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                                   variants={"conv1": "reference", "conv2": "reference"},
                                   params={"conv1": {}, "conv2": {}}, batch=8, streams=1, host_memory="pageable",
                                   repeats=1, warmup=0, profiler="events"))
    argv = ["run-job", "--spec", json.dumps(spec.to_dict()), "--out", str(tmp_path / "r.json"), "--worker"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"convsweep: No space left on device ({tmp_path / 'r.json'})\n"
    with pytest.raises(OSError):
        cli.main(["--verbose", *argv])

    with open("/dev/full", "w") as full:  # stdout on a full disk: the command's own writes fail
        proc = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "query", "--list"], stdout=full,
                              stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("convsweep: No space left on device"), proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_query_param_without_a_value_is_one_line():
    line = one_error_line(convsweep("query", "summary", "--param", "foo"))
    assert line == "convsweep: --param foo: expected NAME=VALUE"


def test_query_passes_its_time_limit_and_row_cap(monkeypatch, capsys):
    from convsweep.app import cli
    from convsweep.analysis import query, questions

    asked = {}
    monkeypatch.setattr(questions, "run_question", lambda *args, **kwargs: asked.update(kwargs) or "table")
    assert cli.main(["query", "summary", "--timeout", "2.5", "--max-rows", "7", "--param", "batch=100"]) == 0
    assert (asked["timeout_s"], asked["max_rows"], asked["params"]) == (2.5, 7, {"batch": "100"})
    assert cli.main(["query", "summary"]) == 0
    assert (asked["timeout_s"], asked["max_rows"]) == (query.DEFAULT_TIMEOUT_S, query.DEFAULT_MAX_ROWS)
    for bad in (["--timeout", "0"], ["--timeout", "nan"], ["--max-rows", "0"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["query", "summary", *bad])
    assert "--timeout: expected a number of seconds above 0, got '0'" in capsys.readouterr().err


def test_run_job_takes_a_line_of_jobs_json(tmp_path):
    """As the --spec help says: a line of `convsweep jobs --json` (with its job_id, settings and sweep) is a spec."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("experiments:\n  t:\n    variants: [reference]\n    batches: [8, 16]\n    repeats: 1\n"
                     "    warmup: 0\n    profiler: events\n")
    line = convsweep("jobs", "--json", "--config", str(sweep)).stdout.splitlines()[0]
    spec = json.loads(line)
    assert {"job_id", "settings", "sweep"} <= set(spec)
    proc = convsweep("run-job", "--spec", line, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["job_id"] == spec["job_id"] and result["sweep"] == spec["sweep"]

    edited = json.dumps({**spec, "batch": 32})
    line = one_error_line(convsweep("run-job", "--spec", edited, "--out", str(tmp_path / "edited.json")))
    assert f"job_id '{spec['job_id']}' is not its spec's (reference-b32-" in line
    assert not (tmp_path / "edited.json").exists()


def test_ingest_takes_folders_of_results(tmp_path):
    from store_fixtures import make_result, write_results

    write_results(tmp_path / "runs", [make_result("naive", 100), make_result("tiled", 100)])
    (tmp_path / "runs" / "naive-b100.partial").mkdir()  # a job's resume folder: not a result
    (tmp_path / "runs" / ".x.json.0a1b.tmp").write_text("{")  # a writer's temporary: not a result
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    proc = convsweep("ingest", "--db", db, "--report", str(tmp_path / "ingested.json"), str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "ingested.json").read_text())["files"] == 2
    assert "2 added, 0 already stored" in proc.stdout
