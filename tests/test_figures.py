"""Figures from the database, on the CPU: each kind's Figure is titled, labelled with units and
captioned with the GPU and commit, shows the stored numbers, and is written as a PNG; missing data,
a bad bench file and a missing matplotlib are one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import canonical_hash
from convsweep.figures import FIGURES, KINDS, FigureKind, figure, plot
from convsweep.analysis.reading import MissingData, load_ceilings
from convsweep.store import ingest_files, ingest_result, open_store
from store_fixtures import every_layer, make_job_file, make_result

pytest.importorskip("matplotlib", minversion="3.8", reason="figures need matplotlib (a dependency of convsweep)")

GPU = "NVIDIA H100 80GB HBM3"
COMMITS = ("abc123" + "0" * 34, "def456" + "1" * 34)
BASELINE = "lenet86-baseline"
STREAMS = "lenet86-streams"
TUNING = "lenet86-tuning"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# LeNet-86's conv layers per image: (FLOPs, floor bytes in fp32: input, weights, bias, pooled output).
LENET_WORK = ((2_508_800, 55_984), (7_250_432, 42_304))
# Op times (conv1, conv2) in ms at batch 100, 1000 and 10000: made up, shaped like the lent H100's.
BASELINE_MS = {
    "naive": ((0.082, 0.191), (0.740, 1.76), (7.30, 17.4)),
    "fused_conv_relu_pool": ((0.030, 0.050), (0.120, 0.300), (1.10, 2.90)),
    "tf32_sliding_window": ((0.025, 0.030), (0.070, 0.090), (0.520, 0.610)),
    "fp16_sliding_window": ((0.020, 0.022), (0.045, 0.050), (0.259, 0.313)),
    "reference": ((2.1, 5.3), (21.0, 53.0), (210.0, 530.0)),  # the CPU, slower than naive
}
BENCH = {"format": 1, "device": GPU, "batch": 10000,
         "ceilings": {"dtod_GBps": 3006.0, "h2d_GBps": 55.2,
                      "matmul_TFLOPps": {"fp32": 52.2, "tf32": 406.7, "fp16": 693.1}}}


def floors(batch: int) -> dict[str, dict[str, int]]:
    return {layer: {"flops": flops * batch, "bytes": nbytes * batch}
            for layer, (flops, nbytes) in zip(("conv1", "conv2"), LENET_WORK)}


def measured(result: dict, day: int, commit: str, **timings) -> dict:
    """`result` measured on 2026-11-<day> at `commit`, with `timings` changed."""
    result["started_at"] = f"2026-11-{day:02d}T10:00:00+00:00"
    result["git"] = {"commit": commit, "dirty": False}
    result["timings"].update(timings)
    return result


def baseline_results() -> list[dict]:
    """Four GPU variants and the CPU reference at the seeds' three batches, over two days and two
    commits; the fastest variant's batch 100 run is incorrect (no time of its own in the figures)."""
    results = []
    for k, (variant, times) in enumerate(BASELINE_MS.items()):
        for batch, op_ms in zip((100, 1000, 10000), times):
            status = "incorrect" if (variant, batch) == ("fp16_sliding_window", 100) else "ok"
            result = make_result(variant, batch, op_time_ms=op_ms, status=status, experiment=BASELINE,
                                 floors=floors(batch))
            result["phases_s"] = {"process_start": 0.8, "load": 0.4 + batch / 5e4, "compile": 0.3 + 0.1 * k,
                                  "warmup": 0.05, "timed": 0.02 * sum(op_ms) + 0.2, "check": 0.1, "profile": 2.2}
            later = k * 2 // len(BASELINE_MS)  # the first half of the variants measured a day before the rest
            results.append(measured(result, 22 + later, COMMITS[later], total_s=4.6 + batch / 4e3))
    return results


def streams_results() -> list[dict]:
    """Two variants at two batches, 1/2/4/8 streams from pageable, pinned and registered memory:
    pinned and registered hide more of the copy the more streams; pageable hides none."""
    results = []
    for variant, compute_ms in (("naive", 25.0), ("register_tiled_gemm", 3.0)):
        for batch in (1000, 10000):
            for memory, h2d_ms, hides in (("pageable", 39.0, 0.0), ("pinned", 5.5, 1.0), ("registered", 5.6, 0.8)):
                for streams in (1, 2, 4, 8):
                    hidden = hides * (1 - 1 / streams) * min(1.0, compute_ms / h2d_ms + 0.3)
                    scale = batch / 10000
                    forward_ms = scale * (compute_ms + h2d_ms * (1 - 0.9 * hidden))
                    result = make_result(variant, batch, streams=streams, host_memory=memory, experiment=STREAMS,
                                         op_time_ms=(scale * compute_ms / 3, scale * compute_ms / 2))
                    results.append(measured(result, 24, COMMITS[1], forward_ms=forward_ms, overlap=hidden * 0.9,
                                            h2d_ms=scale * h2d_ms))
    return results


def tuning_job_files(rtg_settings: int = 12) -> list[dict]:
    """Per batch (1000, 10000) a naive grid of five BLOCKs (1024 failed) and a register_tiled_gemm
    grid of `rtg_settings` settings (the third incorrect), each one job file."""
    files = []
    for batch in (1000, 10000):
        scale = batch / 1000
        naive = []
        for block in (64, 128, 256, 512, 1024):
            status = "failed" if block == 1024 else "ok"
            op_ms = (0.74 * scale * (1 + abs(block - 256) / 1024), 1.76 * scale * (1 + abs(block - 128) / 512))
            naive.append(make_result("naive", batch, host_memory="pinned", experiment=TUNING, status=status,
                                     params=every_layer(BLOCK=block), op_time_ms=op_ms, floors=floors(batch)))
        rtg = []
        for k in range(rtg_settings):
            tunables = {"BLOCK_M": (4, 16, 64)[k % 3], "BLOCK_N": (128, 256)[k // 3 % 2],
                        "BLOCK_K": (8, 16)[k // 6 % 2], "THREAD_M": (4, 8)[k // 12 % 2],
                        "THREAD_N": (4, 8)[k // 24 % 2]}
            op_ms = (0.10 * scale * (1 + 0.15 * (k * 7 % rtg_settings)),
                     0.20 * scale * (1 + 0.10 * (k * 5 % rtg_settings)))
            rtg.append(make_result("register_tiled_gemm", batch, host_memory="pinned", experiment=TUNING,
                                   status="incorrect" if k == 2 else "ok", params=every_layer(**tunables),
                                   op_time_ms=op_ms, floors=floors(batch)))
        for measurements in (naive, rtg):
            for m in measurements:
                measured(m, 25, COMMITS[1])
                m["phases_s"] = {"process_start": 0.8 / len(measurements), "load": 0.5 / len(measurements),
                                 "compile": 0.4, "warmup": 0.02, "timed": 0.3, "check": 0.05,
                                 "profile": 2.0 / len(measurements)}
            files.append(make_job_file(measurements))
    return files


def fill(url: str, rtg_settings: int = 12) -> str:
    """A database holding the three experiments above; returns its URL."""
    engine = open_store(url)
    for result in [*baseline_results(), *streams_results(), *tuning_job_files(rtg_settings)]:
        ingest_result(engine, result, None)
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return fill(f"sqlite:///{tmp_path_factory.mktemp('plot') / 'results.sqlite'}")


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    path.write_text(json.dumps(BENCH))
    return path


def caption(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts).replace("\n", " ")


def axis_labels(fig) -> set[str]:
    return {label for ax in fig.axes for label in (ax.get_xlabel(), ax.get_ylabel()) if label}


def line(ax, label: str):
    (found,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return found


# Per kind: its experiment, a piece of its title and the axis labels it must carry.
EXPECTED = {
    "op-time": (BASELINE, "Op time per variant and batch", {"batch (images)", "op time (ms, log scale)"}),
    "speedup": (BASELINE, "Speedup over naive", {"batch (images)", "speedup over naive (×, log scale)"}),
    "roofline": (BASELINE, "Roofline per conv layer",
                 {"arithmetic intensity (FLOP/byte, floor bytes)", "achieved GFLOP/s (log scale)"}),
    "streams": (STREAMS, "Forward time and overlap against streams",
                {"CUDA streams", "forward time (ms, log scale)", "copy time hidden under kernels (%)"}),
    "phases": (BASELINE, "Where each job's wall time went",
               {"wall time (s)", "job (variant and cell, as its id names them)"}),
    "tuning": (TUNING, "Tuning landscape", {"op time (ms, log scale)"}),
}


# Kinds whose data this module's database does not hold, each tested in a module of its own.
ELSEWHERE = {"formats": "test_figure_formats.py", "history": "test_figure_history.py",
             "pareto": "test_figure_pareto.py"}


def test_every_kind_is_covered():
    assert set(EXPECTED) | set(ELSEWHERE) == set(KINDS) and not set(EXPECTED) & set(ELSEWHERE)
    assert all((Path(__file__).parent / module).is_file() for module in ELSEWHERE.values())


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_each_figure_has_its_title_axis_labels_and_a_caption_naming_gpu_and_commit(url, kind, tmp_path):
    experiment, title, labels = EXPECTED[kind]
    fig = figure(kind, experiment, url)
    assert title in fig.get_suptitle() and experiment in fig.get_suptitle()
    assert labels <= axis_labels(fig)
    text = caption(fig)
    assert GPU in text and COMMITS[1][:10] in text and "2026-11-2" in text
    assert all(ax.has_data() for ax in fig.axes)

    done = plot(kind, url=url, experiment=experiment, out=tmp_path)
    assert done.paths == [tmp_path / f"{kind}.png"]
    data = done.paths[0].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_op_time_lines_are_the_stored_op_times(url):
    fig = figure("op-time", BASELINE, url)
    conv1, conv2 = fig.axes[:2]
    naive = line(conv1, "naive")
    assert list(naive.get_xdata()) == [100, 1000, 10000]
    assert list(naive.get_ydata()) == pytest.approx([0.082, 0.740, 7.30])
    assert list(line(conv2, "fp16_sliding_window").get_xdata()) == [1000, 10000]  # batch 100 was incorrect
    assert conv1.get_yscale() == "log" and conv1.get_title() == "conv1 (op time 1)"
    text = caption(fig)
    assert "from 2026-11-22 to 2026-11-23" in text and COMMITS[0][:10] in text and COMMITS[1][:10] in text


def test_speedup_bars_are_naive_over_variant(url):
    fig = figure("speedup", BASELINE, url)
    conv2 = fig.axes[1]
    labels = [t.get_text() for t in conv2.texts]
    assert f"{1.76 / 0.300:.3g}×" in labels  # fused_conv_relu_pool, batch 1000
    assert f"{17.4 / 0.313:.3g}×" in labels  # fp16_sliding_window, batch 10000
    assert f"{1.76 / 53.0:.3g}×" in labels  # the CPU reference: a bar down from 1×
    assert "naive" not in [h.get_label() for h in conv2.patches]


def test_speedup_without_the_naive_baseline_says_so(url):
    with pytest.raises(MissingData, match="no ok naive run: the speedup is over the naive baseline"):
        figure("speedup", "lenet86-baseline-without-naive", _without_naive(url))


def test_a_listed_baseline_that_failed_is_not_told_to_be_added():
    """`add naive to its variants` misled where naive was listed and failed, or was left out for want of a GPU."""
    from convsweep.figures.speedup import _why_no_baseline

    failed = [{"variant": "naive", "status": "failed", "op_time_ms": None}]
    assert _why_no_baseline(failed, "e") == "its naive runs did not finish ok (`convsweep query failures`)"
    said = _why_no_baseline([{"variant": "reference", "status": "ok", "op_time_ms": 20.0}], "e")
    assert "add naive to its variants, or, where it is listed, run it on a GPU" in said
    assert "results/e/not-run.json" in said


def _without_naive(url: str) -> str:
    path = Path(url.removeprefix("sqlite:///")).with_name("no-naive.sqlite")
    engine = open_store(f"sqlite:///{path}")
    for result in baseline_results():
        if result["spec"]["variants"]["conv1"] != "naive":
            result["spec"]["experiment"] = result["sweep"]["experiment"] = "lenet86-baseline-without-naive"
            result["run_key"] = canonical_hash(result["spec"])  # ingest holds a run_key to its spec
            ingest_result(engine, result, None)
    engine.dispose()
    return f"sqlite:///{path}"


def cold(result: dict, op_time_ms: tuple[float, float]) -> dict:
    """The same job with the L2 written over before each conv layer (cache: cold), a job of its own."""
    result = measured(result, 23, COMMITS[1])
    result["spec"]["cache"] = "cold"
    result["run_key"] = canonical_hash(result["spec"])
    result["measurement_id"] = uuid.uuid4().hex
    result["timings"]["op_time_ms"] = dict(zip(("conv1", "conv2"), op_time_ms))
    return result


def test_cold_l2_runs_are_series_of_their_own_against_the_cold_baseline(tmp_path):
    url = f"sqlite:///{tmp_path / 'cold.sqlite'}"
    engine = open_store(url)
    for result in baseline_results():
        ingest_result(engine, result, None)
    ingest_result(engine, cold(make_result("naive", 10000, experiment=BASELINE, floors=floors(10000)), (8.0, 20.0)))
    ingest_result(engine, cold(make_result("fp16_sliding_window", 10000, experiment=BASELINE, floors=floors(10000)),
                               (0.4, 0.5)))
    engine.dispose()
    conv2 = figure("op-time", BASELINE, url).axes[1]
    assert list(line(conv2, "naive").get_ydata()) == pytest.approx([0.191, 1.76, 17.4])  # warm, as before
    assert list(line(conv2, "naive, cold L2").get_ydata()) == pytest.approx([20.0])
    labels = [t.get_text() for t in figure("speedup", BASELINE, url).axes[1].texts]
    assert f"{20.0 / 0.5:.3g}×" in labels and f"{17.4 / 0.313:.3g}×" in labels  # cold over cold, warm over warm


def test_roofline_draws_the_bench_ceilings_and_names_the_bytes(url, bench_file):
    fig = figure("roofline", BASELINE, url, load_ceilings(bench_file))
    conv2 = fig.axes[1]
    roofs = {ln.get_label() for ln in conv2.get_lines()}
    assert {"device copy 3006 GB/s", "fp32 matmul 52.2 TFLOP/s", "fp16 matmul 693.1 TFLOP/s"} <= roofs
    text = caption(fig)
    assert "floor bytes" in text and "not measured DRAM traffic" in text and str(bench_file) in text
    # fp16_sliding_window at batch 10000 on conv2: 72.5 GFLOP in 0.313 ms, at 7250432 / 42304 FLOP/byte
    points = [(ln.get_xdata()[0], ln.get_ydata()[0]) for ln in conv2.get_lines() if ln.get_marker() == "^"]
    assert (pytest.approx(7_250_432 / 42_304), pytest.approx(7_250_432e4 / 0.313e6)) in points


def test_roofline_without_a_bench_file_draws_no_ceilings_and_says_so(url):
    fig = figure("roofline", BASELINE, url)
    assert not [ln for ln in fig.axes[0].get_lines() if "GB/s" in ln.get_label()]
    assert "No ceilings drawn: give --bench FILE" in caption(fig)


def test_streams_figure_shows_forward_and_overlap_per_host_memory(url):
    fig = figure("streams", STREAMS, url)
    forward, overlap = fig.axes[1], fig.axes[3]  # batch 10000: forward above, overlap below
    pinned = line(forward, "register_tiled_gemm, pinned")
    assert list(pinned.get_xdata()) == [1, 2, 4, 8]
    assert pinned.get_ydata()[0] == pytest.approx(3.0 + 5.5)
    assert list(line(overlap, "naive, pageable").get_ydata()) == [0, 0, 0, 0]
    assert line(overlap, "naive, pinned").get_ydata()[-1] == pytest.approx(100 * 0.9 * 7 / 8)
    assert line(overlap, "register_tiled_gemm, registered").get_ydata()[-1] == pytest.approx(
        100 * 0.9 * 0.8 * 7 / 8 * (3.0 / 5.6 + 0.3))


def test_phases_bars_add_up_to_each_jobs_wall_time(url):
    fig = figure("phases", TUNING, url)
    ax = fig.axes[0]
    ends: dict[float, float] = {}
    for bar in ax.patches:
        y = round(bar.get_y() + bar.get_height() / 2)
        ends[y] = max(ends.get(y, 0.0), bar.get_x() + bar.get_width())
    assert len(ends) == 4  # two grids at two batches, one job each
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "naive b1000 s1 pinned (5 settings)" in labels  # the failed setting's share of the job too
    # every setting's total_s (make_result: 6.2 s; none for the failed one) adds up to its job's bar
    assert ends[labels.index("naive b1000 s1 pinned (5 settings)")] == pytest.approx(4 * 6.2)


def test_past_max_bars_jobs_a_bar_is_a_variants_mean_job_and_past_max_bars_variants_the_rest_share_one():
    from convsweep.figures.drawing import MAX_BARS
    from convsweep.figures.phases import variant_bars

    jobs = {f"job{i}": {"variant": f"v{i % (MAX_BARS + 5):02d}", "phases": {"load": 1.0, "timed": float(i)},
                        "total_s": 2.0 * i + 1.0} for i in range(3 * (MAX_BARS + 5))}
    bars, note = variant_bars(jobs)
    assert len(bars) == MAX_BARS and bars[-1]["label"] == "6 other variants: mean of 18 jobs"
    assert [bar["label"].split(":")[0] for bar in bars[:-1]] == [f"v{k:02d}" for k in range(6, MAX_BARS + 5)]
    v44 = [job for job in jobs.values() if job["variant"] == "v44"]  # jobs 44, 89 and 134
    assert bars[-2]["phases"] == {"load": 1.0, "timed": pytest.approx((44 + 89 + 134) / 3)}
    assert bars[-2]["total_s"] == pytest.approx(sum(job["total_s"] for job in v44) / 3)
    assert note == (f" {len(jobs)} jobs, more than the {MAX_BARS} drawn one by one: each bar is a variant's mean job, "
                    "each phase's seconds and the wall time over its jobs (how many in its label); the 6 variants "
                    "with the least wall time in all share the last bar.")


def test_tuning_ranks_the_settings_and_counts_the_ones_without_a_time(url):
    fig = figure("tuning", TUNING, url)
    assert [ax.get_title() for ax in fig.axes] == [f"{layer}, batch {batch}; not ranked: 1 failed, 1 incorrect"
                                                    for layer in ("conv1", "conv2") for batch in (1000, 10000)]
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert len(names) == 4 + 11  # naive 1024 failed, one register_tiled_gemm setting incorrect
    assert names[0] == "4, 128, 8, 4, 4"  # its values, in the order the legend names them
    assert names[-1] == "512"  # the slowest: naive BLOCK=512
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["naive: BLOCK", "register_tiled_gemm: BLOCK_M,\n  BLOCK_N, BLOCK_K, THREAD_M,\n  THREAD_N"]


def test_a_setting_is_named_by_its_values_in_its_variants_order_else_in_full():
    from convsweep.figures.tuning import tunable_names, values_text

    settings = [{"variant": "tiled", "params": {"TILE": 16, "UNROLL": 2}},
                {"variant": "tiled", "params": {"TILE": 32}},  # a partial setting adds no name of its own
                {"variant": "naive", "params": {}}]
    names = tunable_names(settings)
    assert names == {"tiled": ["TILE", "UNROLL"], "naive": []}
    assert values_text({"TILE": 16, "UNROLL": 2}, names["tiled"]) == "16, 2"
    assert values_text({"UNROLL": 2, "TILE": 16}, names["tiled"]) == "16, 2"  # keys in another order
    assert values_text({"TILE": 32}, names["tiled"]) == "TILE=32"
    assert values_text({}, names["naive"]) == "(defaults)"


def test_tuning_of_a_large_grid_names_only_the_fastest(tmp_path):
    url = fill(f"sqlite:///{tmp_path / 'wide.sqlite'}", rtg_settings=40)
    ax = figure("tuning", TUNING, url).axes[0]
    assert ax.get_ylabel() == "rank (1 = fastest)"
    assert [t.get_text() for t in ax.texts if t.get_text().startswith("fastest: register_tiled_gemm")]


def test_a_grid_none_of_whose_settings_finished_ok_is_one_line_not_a_crash():
    """A tuning grid whose kernel never compiled had no op time to log-scale: make_report died on matplotlib's
    ValueError and the sweep ended `report not made`."""
    from convsweep.figures import tuning

    rows = [{"layer_index": 0, "layer": "conv1", "batch": 8, "variant": "broken", "layer_variant": "broken",
             "params": {"BLOCK": block}, "status": "failed", "op_time_ms": None, "cache": "warm"}
            for block in (64, 256)]
    with pytest.raises(MissingData, match="has a tunable grid, but no setting of it finished ok"):
        tuning.draw(rows, "t")


@pytest.mark.parametrize("kind, experiment, why", [
    ("streams", BASELINE, "has no ok runs at several stream counts"),
    ("tuning", BASELINE, "has no tunable grid"),
])
def test_missing_data_is_one_clear_line(url, kind, experiment, why):
    with pytest.raises(MissingData, match=why) as caught:
        plot(kind, url=url, experiment=experiment)
    assert "\n" not in str(caught.value)


def test_an_unknown_experiment_names_the_stored_ones(url):
    with pytest.raises(MissingData, match=f"no runs of experiment 'nope' in the database .*{BASELINE}"):
        plot("op-time", url=url, experiment="nope")


def test_a_bench_file_without_matmul_rates_draws_the_memory_roof_alone(url, tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "ceilings": {"dtod_GBps": 4220.0}}))
    fig = figure("roofline", BASELINE, url, load_ceilings(path))
    assert [ln.get_label() for ln in fig.axes[0].get_lines() if "/s" in ln.get_label()] == ["device copy 4220 GB/s"]
    text = caption(fig)
    assert "no compute roof" in text and "The bench ran on NVIDIA H200, not on the GPU of these runs" in text


def test_figures_work_on_both_databases(db_url):
    fill(db_url)
    fig = figure("tuning", TUNING, db_url)  # JSON tunables: SQLite hands back text, PostgreSQL objects
    assert "64" in [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "on 2026-11-25" in caption(fig)  # started_at: SQLite text, a PostgreSQL datetime


def test_without_matplotlib_the_error_says_how_to_install_it(url, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConvsweepError, match=r"figures need matplotlib, which `pip install -e \.` installs"):
        figure("op-time", BASELINE, url)


def convsweep(*args):
    return subprocess.run([sys.executable, "-m", "convsweep.app.cli", *args], capture_output=True, text=True)


def test_cli_plot_all_writes_every_figure_each_experiment_has(url, bench_file, tmp_path):
    proc = convsweep("plot", "all", "--db", url, "--out", str(tmp_path), "--bench", str(bench_file))
    assert proc.returncode == 0, proc.stderr
    written = sorted(Path(p).name for p in proc.stdout.splitlines() if not p.startswith("skipped "))
    assert written == sorted(f"{e}-{k}.png" for e, k in [
        (BASELINE, "op-time"), (BASELINE, "speedup"), (BASELINE, "roofline"), (BASELINE, "phases"),
        (STREAMS, "op-time"), (STREAMS, "speedup"), (STREAMS, "roofline"), (STREAMS, "streams"),
        (STREAMS, "phases"), (TUNING, "op-time"), (TUNING, "speedup"), (TUNING, "roofline"), (TUNING, "phases"),
        (TUNING, "tuning")])
    assert all((tmp_path / name).read_bytes().startswith(PNG_MAGIC) for name in written)
    assert f"skipped streams: experiment '{BASELINE}' has no ok runs" in proc.stdout
    assert f"skipped formats: experiment '{BASELINE}' has ok runs in one input format only (fp32)" in proc.stdout


def test_figures_drawn_side_by_side_keep_their_order_and_a_bug_in_one_is_raised(url, tmp_path, monkeypatch):
    """`plot all` draws its figures in forked processes: the results come back in the order asked,
    a figure without data is skipped with its reason, and any other error is raised, never skipped."""
    done = plot("all", url=url, experiment=TUNING, out=tmp_path)
    skipped = ("streams", "formats", "history", "pareto")  # no energy measured here
    assert [p.name for p in done.paths] == [f"{k}.png" for k in KINDS if k not in skipped]
    assert [k for k, _ in done.skipped] == list(skipped)

    def broken(rows, experiment, ceilings=None):
        raise RuntimeError("a bug in a figure")

    monkeypatch.setitem(FIGURES, "phases", FigureKind(FIGURES["phases"].rows, broken))
    with pytest.raises(RuntimeError, match="a bug in a figure"):
        plot("all", url=url, experiment=TUNING, out=tmp_path / "again")


def test_cli_plot_with_an_experiment_writes_kind_named_files(url, tmp_path):
    proc = convsweep("plot", "streams", "--experiment", STREAMS, "--db", url, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(tmp_path / "streams.png")]


def test_cli_missing_data_is_one_line_and_exit_2(url, tmp_path):
    proc = convsweep("plot", "tuning", "--experiment", BASELINE, "--db", url, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"convsweep: experiment '{BASELINE}' has no tunable grid: every variant ran "
                                        "at one setting (sweeps/tuning.yaml sweeps some)"]
    assert not list(tmp_path.iterdir())


def test_roofline_takes_nsight_computes_dram_bytes_where_a_setting_was_profiled(tmp_path):
    from convsweep.figures.rows import layer_rows

    fixtures = Path(__file__).parent / "fixtures" / "gpu-results"
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = open_store(url)
    report = ingest_files(engine, sorted(fixtures.glob("*.json")))
    engine.dispose()
    assert not report.errors
    rows = {(r["variant"], r["batch"], r["layer"], r["cache"]): r for r in layer_rows(url, "lenet86-ci")
            if r["status"] == "ok"}
    naive = rows[("naive", 10000, "conv2", "warm")]
    profile = json.loads(next(fixtures.glob("ncu-naive-*.json")).read_text())
    conv2 = next(p["metrics"] for p in profile["profiles"] if p["layer"] == "conv2")
    assert naive["dram_bytes"] == pytest.approx(int(conv2["dram_read_bytes"]) + int(conv2["dram_write_bytes"]))
    assert rows[("naive", 1000, "conv2", "warm")]["dram_bytes"] is None  # not profiled: its floor bytes
    fig = figure("roofline", "lenet86-ci", url)
    assert "FLOP/byte, DRAM bytes or floor bytes" in " ".join(axis_labels(fig))
    assert "what Nsight Compute measured" in caption(fig) and "what the layer must move at least" in caption(fig)


def test_a_whole_network_variant_is_named_so_in_the_legend():
    """Its conv1 op time is the whole network's: beside one conv layer's times it must say so."""
    from convsweep.figures.rows import whole_network_suffix

    assert whole_network_suffix("fp16_fused_network") == " (whole network)"
    assert whole_network_suffix("fp16_sliding_window") == "" and whole_network_suffix("gone_variant") == ""


# -- where figures are written (issue 52): stored names stay inside results/, no link is written through ----------
def two_variants(url: str, *experiments: str, **overrides) -> str:
    engine = open_store(url)
    for experiment in experiments:
        for variant, op_ms in (("naive", (0.74, 1.76)), ("tiled", (0.5, 1.2))):
            for batch in (100, 1000):
                ingest_result(engine, make_result(variant, batch, op_time_ms=op_ms, experiment=experiment,
                                                  floors=floors(batch), **overrides), None)
    engine.dispose()
    return url


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if not p.is_dir())


def test_plot_all_keeps_stored_experiment_names_inside_the_results_directory(tmp_path, monkeypatch):
    """A result file names its experiment: `plot all` wrote a name that is an absolute path as one."""
    root = tmp_path / "root"
    work, victim = root / "work", root / "victim"
    work.mkdir(parents=True)
    victim.mkdir()
    names = [str(victim / "abs"), "../../escape", "../../../../x", ".hidden", "plain"]
    url = two_variants(f"sqlite:///{tmp_path / 'db.sqlite'}", *names)
    monkeypatch.chdir(work)
    done = plot("op-time", url=url)
    assert len(done.paths) == len(names)
    assert all(p.parent == Path("results/figures") and not p.name.startswith(".") for p in done.paths)
    assert Path("results/figures/plain-op-time.png") in done.paths
    assert files_under(root) == sorted(work / p for p in done.paths)  # nothing in victim/, nothing beside
    assert not list(tmp_path.glob("*.png"))  # nor above


def test_a_link_planted_at_a_figures_name_is_replaced_never_written_through(tmp_path, monkeypatch):
    url = two_variants(f"sqlite:///{tmp_path / 'db.sqlite'}", "plain")
    monkeypatch.chdir(tmp_path)
    figures = Path("results/plain/figures")
    figures.mkdir(parents=True)
    secrets = {name: tmp_path / f"secret-{k}" for k, name in enumerate(("op-time.png", ".op-time.png.partial"))}
    for name, secret in secrets.items():
        secret.write_text("precious\n")
        (figures / name).symlink_to(secret)
    done = plot("op-time", url=url, experiment="plain")
    assert done.paths == [figures / "op-time.png"]
    assert all(secret.read_text() == "precious\n" for secret in secrets.values())
    assert not (figures / "op-time.png").is_symlink() and (figures / "op-time.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("planted", ["results/plain/figures", "results/plain"])
def test_a_link_planted_where_plot_makes_a_directory_is_refused_in_one_line(tmp_path, monkeypatch, planted):
    url = two_variants(f"sqlite:///{tmp_path / 'db.sqlite'}", "plain")
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(planted).parent.mkdir(parents=True, exist_ok=True)
    Path(planted).symlink_to(elsewhere)
    with pytest.raises(ConvsweepError, match=rf"^{planted} is a link, a directory convsweep makes, to {elsewhere}: "
                                             "convsweep writes no file through it; remove it or give --out$"):
        plot("op-time", url=url, experiment="plain")
    assert files_under(elsewhere) == []
    proc = convsweep("plot", "op-time", "--experiment", "plain", "--db", url)  # the command: one line, exit 2
    assert proc.returncode == 2 and proc.stderr.startswith(f"convsweep: {planted} is a link")


def test_an_out_directory_that_another_user_linked_is_refused(tmp_path, monkeypatch):
    url = two_variants(f"sqlite:///{tmp_path / 'db.sqlite'}", "plain")
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.symlink_to(elsewhere)
    assert plot("op-time", url=url, experiment="plain", out=out).paths == [out / "op-time.png"]  # the user's own
    (elsewhere / "op-time.png").unlink()
    if os.geteuid() == 0:
        os.lchown(out, 4242, 4242)
    else:
        monkeypatch.setattr("convsweep.base.fileio._own_uid", lambda: os.geteuid() + 1)
    with pytest.raises(ConvsweepError, match=r"out is a link, made by another user \(uid \d+\)"):
        plot("op-time", url=url, experiment="plain", out=out)
    assert files_under(elsewhere) == []


@pytest.mark.parametrize("kind", ["op-time", "speedup", "roofline", "phases", "tuning"])
def test_math_markup_in_a_stored_name_is_drawn_as_it_is(tmp_path, kind):
    """A GPU and a variant named with a `$` (matplotlib's math markup, here unbalanced) stopped every figure and
    the report with a ParseSyntaxException; they are drawn as they are written."""
    gpu, variant, experiment = r"NVIDIA $\frac{1}{$ H100", "tiled_$x^2", r"lenet $\sqrt{$ x"
    environment = {**make_result()["environment"], "gpu": gpu}
    url = two_variants(f"sqlite:///{tmp_path / 'db.sqlite'}", experiment, environment=environment)
    engine = open_store(url)
    for block in (64, 128):  # a grid, for the tuning figure
        ingest_result(engine, make_result(variant, 100, op_time_ms=(0.3, 0.6), experiment=experiment,
                                          floors=floors(100), environment=environment,
                                          params={"conv1": {"BLOCK": block}, "conv2": {"BLOCK": block}}))
    engine.dispose()
    done = plot(kind, url=url, experiment=experiment, out=tmp_path / "figures")
    assert done.paths[0].read_bytes().startswith(PNG_MAGIC)
    found = texts(figure(kind, experiment, url))
    assert any(gpu in t for t in found) or kind == "phases"
    assert any("tiled_$x^2" in t or r"tiled_\$x^2" in t for t in found)


# -- long strings (issue 52: a 30,000-character GPU name crashed every figure) -------------------------------------
LONG_GPU = "NVIDIA " + "H" * 30_000
LONG_VARIANT = "tiled_" + "v" * 5_000


def texts(fig) -> list[str]:
    from matplotlib.text import Text

    fig.canvas.draw()  # tick labels are made when drawn
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.parametrize("kind", ["op-time", "speedup", "roofline", "phases"])
def test_long_names_are_shortened_in_every_text_of_a_figure(tmp_path, kind):
    url = two_variants(f"sqlite:///{tmp_path / 'db.sqlite'}", "e" * 2_000,
                       environment={**make_result()["environment"], "gpu": LONG_GPU})
    engine = open_store(url)
    environment = {**make_result()["environment"], "gpu": LONG_GPU}
    ingest_result(engine, make_result(LONG_VARIANT, 100, op_time_ms=(0.3, 0.6), experiment="e" * 2_000,
                                      floors=floors(100), environment=environment))
    engine.dispose()
    done = plot(kind, url=url, experiment="e" * 2_000, out=tmp_path / "figures")
    assert done.paths[0].read_bytes().startswith(PNG_MAGIC)
    from convsweep.figures.drawing import CAPTION_MAX_CHARS, LABEL_MAX_CHARS

    fig = figure(kind, "e" * 2_000, url)
    found = texts(fig)
    text = caption(fig)
    assert max(len(t) for t in found if t not in {t.get_text() for t in fig.texts}) <= LABEL_MAX_CHARS
    assert len(text) <= CAPTION_MAX_CHARS + 100  # the wrapping's line breaks
    assert "Measured on NVIDIA HHH" in text and "HHH on 2026-11-22, at commit abc1230000" in text
    assert "…" in fig.get_suptitle() and any(t.startswith("tiled_vvv") and "…" in t for t in found)
    assert text.rstrip().endswith(".")  # the notes after the GPU's sentence are all there
