"""The seeds-format report on the CPU, on both backends: the seeds' table per variant, speedups over
the previous and the baseline variant, Nsight Compute evidence lines with and without profiles, the
figures linked (Markdown) or embedded (HTML), the CSV tables, and the `convsweep report` options."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os

import pytest

from convsweep.base import axes, document
from convsweep import report
from convsweep.app.cli import main
from convsweep.base.errors import ConvsweepError
from convsweep.base.numbers import significant
from convsweep.figures import draw
from convsweep.measure.ncu import LaunchProfile
from convsweep.store import ingest_result, open_store
from store_fixtures import every_layer, integrity_results, make_job_file, make_result

EXPERIMENT = "lenet86-baseline"
# A 1x1 PNG: report.py embeds and links figures without looking inside them.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
                       "AAAABJRU5ErkJggg==")


def results() -> list[dict]:
    """naive and tiled at two batches, fast at one, a grid of `grid` with one failed setting, and a
    CPU reference run at a batch no GPU variant has."""
    return [
        make_result("naive", 100, op_time_ms=(0.082, 0.191)),
        make_result("naive", 1000, op_time_ms=(0.740, 1.76)),
        make_result("tiled", 100, op_time_ms=(0.060, 0.150)),
        make_result("tiled", 1000, op_time_ms=(0.400, 1.00)),
        make_result("fast", 1000, op_time_ms=(0.100, 0.150)),
        make_job_file([make_result("grid", 1000, params=every_layer(BLOCK=64), op_time_ms=(0.50, 1.10)),
                       make_result("grid", 1000, params=every_layer(BLOCK=128), op_time_ms=(0.45, 1.00)),
                       make_result("grid", 1000, params=every_layer(BLOCK=256), status="failed")]),
        make_result("reference", 8, op_time_ms=(12.8, 1.78), profiler="cpu",
                    environment={**make_result()["environment"], "gpu": None}),
    ]


def fill(url: str, extra: tuple = ()) -> None:
    engine = open_store(url)
    try:
        for result in [*results(), *extra]:
            ingest_result(engine, result, None)
    finally:
        engine.dispose()


def profile_of(result: dict, dram_pct: float = 91.0) -> dict:
    """An Nsight Compute profile file of a one-setting run: both conv layers, one launch each."""
    launches = [LaunchProfile(0, layer, f"{result['spec']['variants'][layer]}_forward", 0,
                              {"duration_ns": 191_000.0, "dram_pct": dram_pct, "sm_pct": 35.0, "registers": 40,
                               "achieved_occupancy_pct": 62.0, "l2_hit_pct": 55.0},
                              [{"reason": "long_scoreboard", "share": 0.6}]).record()
                for layer in ("conv1", "conv2")]
    return {"format": "ncu-1", "profile_id": hashlib.sha256(result["run_key"].encode()).hexdigest()[:32],
            "job_id": result["job_id"], "job_key": "k" * 64, "job": {**result["spec"]}, "sweep": result["sweep"],
            "status": "ok", "started_at": "2026-11-22T19:00:00+00:00",
            "settings": [{"index": 0, "run_key": result["run_key"], "params": result["spec"]["params"]}],
            "profiles": launches}


def sections(text: str) -> dict[str, str]:
    """report.md by variant: each `## ` section's text."""
    return {part.split("\n", 1)[0].strip(): part for part in text.split("\n## ")[1:]}


def test_the_report_has_the_seeds_table_speedups_and_no_evidence_without_profiles(db_url, tmp_path):
    fill(db_url)
    figures = tmp_path / "figures"
    figures.mkdir()
    for kind in ("speedup", "op-time"):
        (figures / f"{kind}.png").write_bytes(PNG)
    out = tmp_path / "out"
    done = report.write(db_url, EXPERIMENT, markdown=out / "report.md", page=out / "page.html", tables=out / "tables",
                        figures_dir=figures)
    assert [p.name for p in done.paths] == ["report.md", "page.html", "seeds.csv", "why.csv"]
    text = (tmp_path / "out" / "report.md").read_text()
    parts = sections(text)
    # The baseline first, then from the slowest to the fastest; the CPU variant sharing no batch last.
    assert list(parts) == ["`naive` (the baseline)", "`grid`", "`tiled`", "`fast`", "`reference`", "Figures"]

    naive = parts["`naive` (the baseline)"]
    assert "0.08200" in naive and "0.1910" in naive and "0.9820" in naive and "### Speedup" not in naive
    tiled = parts["`tiled`"]
    assert "× over grid (previous)" in tiled and "× over naive (baseline)" in tiled
    rows = {line.split("|")[1].strip(): line for line in tiled.splitlines() if line.startswith("|") and "×" in line}
    assert "1.30×" in rows["100"] and "—" in rows["100"]  # no grid run at batch 100
    assert "1.79×" in rows["1000"] and "1.04×" in rows["1000"]  # 2.5 / 1.4 over naive, 1.45 / 1.4 over grid
    assert "None taken: no Nsight Compute profile of `tiled` is stored" in tiled

    grid = parts["`grid`"]
    assert "BLOCK=128" in grid and "BLOCK=64" in grid and "× over naive (baseline, also the previous)" in grid
    assert "failed: compile failed: tiled.cu(12): error: identifier TILE undefined" in grid and "(BLOCK=256)" in grid
    assert "None: no `fast` or `naive` run" in parts["`reference`"]
    assert "None: `reference` runs on the CPU" in parts["`reference`"]
    assert "the CPU" in text.split("\n\n")[1]  # its runs measured no GPU

    assert text.index("![op-time](../figures/op-time.png)") < text.index("![speedup](../figures/speedup.png)")
    assert "Not drawn, for want of data: roofline, streams, formats, phases, tuning" in parts["Figures"]

    page = (tmp_path / "out" / "page.html").read_text()
    tables = sum(line.startswith("|-") for line in text.splitlines())
    assert page.count("<table>") == tables and page.count('src="data:image/png;base64,') == 2
    assert "<code>naive</code> (the baseline)" in page and "<strong>op time 1</strong>" in page

    seeds = list(csv.DictReader(io.StringIO((tmp_path / "out" / "tables" / "seeds.csv").read_text())))
    assert [r["variant"] for r in seeds][:3] == ["naive", "naive", "grid"] and len(seeds) == len(results()) + 2
    tiled_1000 = next(r for r in seeds if r["variant"] == "tiled" and r["batch"] == "1000")
    assert (tiled_1000["previous"], tiled_1000["× over previous"], tiled_1000["× over naive"]) == \
        ("grid", "1.036", "1.786")
    assert next(r for r in seeds if r["status"] == "failed")["error"].startswith("compile failed")
    why = (tmp_path / "out" / "tables" / "why.csv").read_text().splitlines()
    assert why == ["experiment,variant,batch,layer,kernel,tunables,why,ncu time (ms),SM %,DRAM %,occupancy %,"
                   "occupancy limiter,registers,smem/block,L1 hit %,L2 hit %,DRAM bytes,FLOPs (CUDA cores)"]


def test_stored_profiles_give_an_evidence_line_per_conv_layer(db_url, tmp_path):
    fill(db_url)
    tiled = make_result("tiled", 1000, op_time_ms=(0.400, 1.00))
    engine = open_store(db_url)
    try:
        ingest_result(engine, profile_of(tiled), None)
        ingest_result(engine, profile_of(make_result("naive", 1000), dram_pct=12.0), None)
    finally:
        engine.dispose()
    report.write(db_url, EXPERIMENT, markdown=tmp_path / "report.md", tables=tmp_path)
    parts = sections((tmp_path / "report.md").read_text())
    lines = [line for line in parts["`tiled`"].splitlines() if line.startswith("- batch")]
    assert lines == [f"- batch 1000, {layer} `tiled_forward`: **memory-bound: DRAM 91% of peak** (ncu 0.1910 ms; "
                     "SM 35%; DRAM 91%; occupancy 62%; 40 registers; L2 hit 55%)" for layer in ("conv1", "conv2")]
    naive = [line for line in parts["`naive` (the baseline)"].splitlines() if line.startswith("- batch")]
    assert len(naive) == 2 and "latency: 62% occupancy; stalls long_scoreboard 60%" in naive[0]
    assert "None taken" in parts["`fast`"]
    assert len((tmp_path / "why.csv").read_text().splitlines()) == 1 + 4


def test_variants_run_from_the_baseline_to_the_fastest():
    def run(variant, batch, op_time_ms, status="ok"):
        return {"variant": variant, **{axis.name: axis.default for axis in axes.AXES if not axis.required},
                "batch": batch, "streams": 1, "host_memory": "pageable", "status": status, "op_time_ms": op_time_ms}

    runs = [run("z_fast", 1000, 1.0), run("naive", 1000, 10.0), run("naive", 100, 1.0), run("a_slow", 1000, 5.0),
            run("a_slow", 100, 0.1), run("cpu", 8, 50.0), run("broken", 1000, None, "failed")]
    assert report.variant_order(runs) == ["naive", "a_slow", "z_fast", "broken", "cpu"]
    best = report.fastest(runs)
    assert report.speedup(best, "naive", runs[3]) == 2.0 and report.speedup(best, None, runs[3]) is None


@pytest.mark.parametrize("label, layer, expected", [
    ("naive", "conv2", "naive"), ("conv1=naive,conv2=tiled", "conv2", "tiled"), ("conv1=naive,conv2=tiled", "x", None)])
def test_a_run_label_names_each_layers_variant(label, layer, expected):
    assert report.sections._layer_variant(label, layer) == expected


def test_numbers_keep_four_digits_and_never_an_exponent():
    assert [significant(v) for v in (0.082, 7.3, 64.11, 999.96, 12345.6, None)] == \
        ["0.08200", "7.300", "64.11", "1000", "12346", ""]
    assert report.tunables({"conv1": {"BLOCK": 64}, "conv2": {"BLOCK": 64}}) == "BLOCK=64"
    assert report.tunables({"conv1": {}, "conv2": {}}) == "defaults"
    assert report.tunables({"conv1": {"BLOCK": 64}, "conv2": {"BLOCK": 128}}) == "conv1 BLOCK=64; conv2 BLOCK=128"


def test_html_escapes_what_it_shows():
    page = document.to_html([document.Paragraph("a <b> & `x<y>` **bold**"),
                             document.Table(["h<"], [["<td>"]], [False])], "t<")
    assert "a &lt;b&gt; &amp; <code>x&lt;y&gt;</code> <strong>bold</strong>" in page
    assert "&lt;td&gt;" in page and "<title>t&lt;</title>" in page


def test_an_experiment_without_runs_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    with pytest.raises(ConvsweepError, match="no runs of experiment 'other' in the database"):
        report.write(url, "other", markdown=tmp_path / "r.md")


def test_an_experiment_without_runs_gets_a_report_saying_so_where_asked(tmp_path):
    """The end of a sweep none of whose jobs finished writes every file the report rule names, so that
    `snakemake --report` finds them; each says that nothing is stored yet."""
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    open_store(db).dispose()
    out = tmp_path / "e"
    assert main(["report", "--experiment", "e", "--db", db, "--out", str(out / "summary.md"), "--figures",
                 str(out / "figures"), "--draw", "--markdown", str(out / "report.md"), "--html", str(out / "report.html"),
                 "--tables", str(out / "tables"), "--allow-empty"]) == 0
    for name in ("summary.md", "report.md", "report.html"):
        assert "No run of this experiment is stored yet" in (out / name).read_text()
    assert (out / "tables" / "seeds.csv").read_text().startswith("variant,") and (out / "figures").is_dir()
    assert main(["report", "--experiment", "e", "--db", db, "--out", str(out / "summary.md")]) == 2  # not asked


def test_drawing_skips_kinds_without_data_and_none_is_no_error(tmp_path):
    pytest.importorskip("matplotlib", reason="figures need matplotlib (a dependency of convsweep)")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url, [make_result("broken", 100, status="failed", experiment="failed-only", phases_s={})])
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "op-time.png").write_bytes(PNG)  # from an earlier draw: stale now
    done = draw(url, "failed-only", figures)
    assert done.paths == [] and "no ok run" in done.skipped[0][1] and list(figures.iterdir()) == []
    drawn = draw(url, EXPERIMENT, figures)
    assert {p.stem for p in drawn.paths} >= {"op-time", "speedup", "roofline", "phases", "tuning"}
    assert {kind for kind, _ in drawn.skipped} == {"streams", "formats", "history", "pareto"}


def test_summary_md_tells_a_grids_settings_apart_fastest_first(tmp_path):
    """Without the setting column a grid's rows read as one job measured three times."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    text = report.summary_markdown(report.load(url, EXPERIMENT))
    table = text.split("## Failed or incorrect")[0]
    grid = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("| grid")]
    header = [cell.strip() for cell in next(line for line in table.splitlines() if line.startswith("| variant")).split("|")[1:-1]]
    shown = ["batch", "streams", "host_memory", "cache"]  # the others, where every run has their default, are not
    assert header[:3 + len(shown)] == ["variant", "setting", *shown, "status"]
    status = 2 + len(shown)
    assert [(row[1], row[status]) for row in grid] == [("BLOCK=128", "ok"), ("BLOCK=64", "ok"), ("BLOCK=256", "failed")]
    failed = text.split("## Failed or incorrect")[1]
    assert "| grid" in failed and "BLOCK=256" in failed and "BLOCK=64" not in failed
    # One setting per variant (the default sweep's experiments): no column of tunables to widen the table
    one_each = report.load(url, EXPERIMENT)
    one_each.runs = [run for run in one_each.runs if run["variant"] != "grid" or run["params"]["conv1"]["BLOCK"] == 64]
    assert "setting" not in report.summary_markdown(one_each).split("\n")[4]
    assert "whole network in one kernel" not in text


def test_summary_md_says_why_a_whole_network_variants_op_time_2_is_empty(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    experiment = report.load(url, EXPERIMENT)
    fused = {**experiment.runs[0], "variant": "fp16_fused_network", "op_time_2_ms": None}
    experiment.runs = [*experiment.runs, fused]
    text = report.summary_markdown(experiment)
    assert "fp16_fused_network runs the whole network in one kernel: op time 1 is every layer's time" in text


def test_the_command_writes_what_it_is_asked_and_keeps_summary_md(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    out = tmp_path / "results" / EXPERIMENT
    assert main(["report", "--experiment", EXPERIMENT, "--db", url, "--out", str(out / "summary.md"),
                 "--markdown", str(out / "report.md"), "--html", str(out / "report.html"),
                 "--tables", str(out / "tables"), "--figures", str(out / "figures")]) == 0
    printed = capsys.readouterr().out
    assert str(out / "report.md") in printed and str(out / "tables" / "why.csv") in printed
    summary = (out / "summary.md").read_text()
    assert summary.startswith(f"# {EXPERIMENT}\n") and "| reference" in summary and "## Failed or incorrect" in summary
    assert "No figures in" in (out / "report.md").read_text()
    assert main(["report", "--experiment", EXPERIMENT, "--db", url]) == 2
    assert capsys.readouterr().err.strip() == \
        "convsweep: report: nothing to write: give --out, --markdown, --html, --tables or --draw"


NO_GPU_ERROR = ("cannot open CUDA device 0: \"cuda\" is an NVIDIA driver library and can only be found via system "
                "search. Ensure the NVIDIA display driver is installed.")


def failed_without_a_gpu(variant: str, batch: int, experiment: str = EXPERIMENT) -> dict:
    """A run stored by a sweep from before a machine without a GPU failed the job: no GPU, cuda-python's words."""
    return make_result(variant, batch, status="failed", experiment=experiment, error=NO_GPU_ERROR,
                       environment={**make_result()["environment"], "gpu": None, "gpu_uuid": None})


def test_identical_failures_are_told_once_with_how_many_and_where(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url, [failed_without_a_gpu(variant, batch) for variant in ("slow", "slower") for batch in (10, 20, 30)])
    report.write(url, EXPERIMENT, markdown=tmp_path / "report.md", summary=tmp_path / "summary.md")
    parts = sections((tmp_path / "report.md").read_text())
    assert [line for line in parts["`slow`"].splitlines() if line.startswith("- ")] == \
        [f"- 3 runs (batch 10, 20 and 30): failed: {NO_GPU_ERROR}"]
    assert "(BLOCK=256): failed: compile failed" in parts["`grid`"]  # a failure of its own keeps its one line

    failed = (tmp_path / "summary.md").read_text().split("## Failed or incorrect")[1]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in failed.splitlines() if line.startswith("| ")]
    assert rows == [["runs", "status", "error"],
                    ["grid (BLOCK=256), batch 1000", "failed", "compile failed: tiled.cu(12): error: identifier TILE "
                                                               "undefined"],
                    ["6 runs (slow and slower; batch 10, 20 and 30)", "failed", NO_GPU_ERROR]]


def test_a_report_never_names_a_gpu_that_no_run_opened(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url, [failed_without_a_gpu("naive", batch, experiment="cpu-only-box") for batch in (100, 1000)])
    report.write(url, "cpu-only-box", markdown=tmp_path / "report.md")
    text = (tmp_path / "report.md").read_text()
    assert text.split("\n\n")[1].startswith("No run opened a GPU (runs on 2026-11-22, at commit abc1230000). 2 runs")
    assert "unnamed" not in text
    report.write(url, EXPERIMENT, markdown=tmp_path / "mixed.md")  # the failed runs opened none: left out
    assert (tmp_path / "mixed.md").read_text().split("\n\n")[1].startswith(
        "Measured on NVIDIA H100 80GB HBM3 and the CPU on 2026-11-22")


def test_what_a_variants_kernels_do_is_said_under_it(db_url, tmp_path):
    files = integrity_results()
    for m in files[1]["measurements"]:
        for build in m["builds"]:
            build["findings"] = {"conv_forward": ["global_write"]}
    engine = open_store(db_url)
    for job_file in files:
        ingest_result(engine, job_file, None)
    engine.dispose()
    report.write(db_url, "lenet86-integrity", markdown=tmp_path / "report.md")
    parts = sections((tmp_path / "report.md").read_text())
    assert "- conv_forward: writes module-scope global memory" in parts["`tiled`"]
    assert "module-scope" not in parts["`naive` (the baseline)"]


def test_a_suspect_run_is_listed_with_its_reasons_never_fastest_and_fast_checks_are_marked(db_url, tmp_path):
    """naive BLOCK=128 is suspect and the fastest of all; tiled was measured with fast checks."""
    engine = open_store(db_url)
    for job_file in integrity_results():
        ingest_result(engine, job_file, None)
    engine.dispose()
    experiment = "lenet86-integrity"
    data = report.load(db_url, experiment)
    [naive_best] = report.fastest(data.runs)["naive"].values()
    assert naive_best["params"] == every_layer(BLOCK=64) and naive_best["status"] == "ok"
    report.write(db_url, experiment, markdown=tmp_path / "report.md", tables=tmp_path / "tables",
                 summary=tmp_path / "summary.md")
    text = (tmp_path / "report.md").read_text()
    assert "3 runs, the latest measurement of each setting: 2 ok, 1 suspect. 1 of them measured with fast checks" in text
    parts = sections(text)
    naive, tiled = parts["`naive` (the baseline)"], parts["`tiled`"]
    seeds = naive.split("Not in the table:")[0]
    assert "BLOCK=64" in seeds and "BLOCK=128" not in seeds and "0.05000" not in seeds
    assert "- batch 10000 (BLOCK=128): suspect: conv1 took 0.05 ms, below the physical floor of 0.1038 ms" in naive
    header, _, row = [line for line in tiled.split("### Speedup")[0].splitlines() if line.startswith("|")]
    assert header.rstrip("| ").endswith("checks") and row.rstrip("| ").endswith("fast")
    speedup = [line for line in tiled.split("### Speedup")[1].splitlines() if line.startswith("|   10000")]
    assert speedup and "3.93×" in speedup[0] and speedup[0].rstrip("| ").endswith("fast")  # over naive's ok setting

    summary = (tmp_path / "summary.md").read_text()
    assert "## Failed or incorrect" not in summary
    suspect = summary.split("## Suspect")[1]
    assert "| naive (BLOCK=128), batch 10000 | conv1 took 0.05 ms, below the physical floor" in suspect
    assert "caching test: sighting 2 of a round took 0.41x" in suspect
    assert "| status   | checks   |" in summary.split("## Suspect")[0]

    rows = list(csv.DictReader(io.StringIO((tmp_path / "tables" / "seeds.csv").read_text())))
    by_status = {(row["variant"], row["status"]): row for row in rows}
    assert [row["checks"] for row in rows] == ["full", "full", "fast"]
    assert by_status[("naive", "suspect")]["× over naive"] == "" and by_status[("naive", "suspect")]["error"]
    assert by_status[("tiled", "ok")]["× over naive"] == "3.927"


# -- where the report writes (issue 52): no link it did not make is written through or embedded -------------------
def test_the_end_of_sweep_report_replaces_planted_links_and_never_embeds_one(tmp_path):
    """What the report rule runs, into a results directory where links were planted at the names it writes."""
    pytest.importorskip("matplotlib", reason="figures need matplotlib (a dependency of convsweep)")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    out = tmp_path / "results" / EXPERIMENT
    (out / "figures").mkdir(parents=True)
    precious = {}
    for name in ("report.md", "report.html", "summary.md", "figures/op-time.png", "figures/streams.png",
                 "figures/zz-extra.png"):
        precious[name] = tmp_path / f"precious-{name.replace('/', '-')}"
        precious[name].write_bytes(PNG + name.encode())
        (out / name).symlink_to(precious[name])
    assert main(["report", "--experiment", EXPERIMENT, "--db", url, "--out", str(out / "summary.md"), "--figures",
                 str(out / "figures"), "--draw", "--markdown", str(out / "report.md"), "--html",
                 str(out / "report.html"), "--tables", str(out / "tables")]) == 0
    assert all(path.read_bytes() == PNG + name.encode() for name, path in precious.items())  # every target kept
    for name in ("report.md", "report.html", "summary.md", "figures/op-time.png"):
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert not (out / "figures" / "streams.png").exists()  # a stale kind's name: the link went, not its target
    page = (out / "report.html").read_text()
    assert base64.b64encode(PNG + b"figures/zz-extra.png").decode() not in page and "zz-extra" not in page
    assert "zz-extra" not in (out / "report.md").read_text()


def test_the_report_refuses_a_link_planted_where_it_makes_the_figures_directory(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "results" / EXPERIMENT).mkdir(parents=True)
    (tmp_path / "results" / EXPERIMENT / "figures").symlink_to(elsewhere)
    assert main(["report", "--experiment", EXPERIMENT, "--db", url, "--draw", "--markdown", "report.md"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"convsweep: results/{EXPERIMENT}/figures is a link, a directory convsweep makes, to {elsewhere}: convsweep "
        "writes no file through it; remove it or give --out")
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "report.md").exists()


def test_the_report_refuses_an_output_directory_another_user_linked(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    fill(url)
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.symlink_to(elsewhere)
    if os.geteuid() == 0:
        os.lchown(out, 4242, 4242)
    else:
        monkeypatch.setattr("convsweep.base.fileio._own_uid", lambda: os.geteuid() + 1)
    for where in ({"markdown": out / "report.md"}, {"tables": out}, {"summary": out / "summary.md"}):
        with pytest.raises(ConvsweepError, match=r"out is a link, made by another user \(uid \d+\)"):
            report.write(url, EXPERIMENT, **where)
    assert list(elsewhere.iterdir()) == []
