"""The formats figure from the database, on the CPU: each input format's end-to-end time against the
batch as a solid line and its floor at the GPU's measured rates as a dashed one of the same color, the fastest run of a
cell drawn where it has several, one line of MissingData where the experiment measured one format or
stored no floors, and `convsweep plot formats` writing a PNG."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid

import pytest

from convsweep.figures import figure, plot
from convsweep.figures.formats import format_rows
from convsweep.analysis.reading import MissingData
from convsweep.store import ingest_result, open_store
from store_fixtures import make_result

pytest.importorskip("matplotlib", minversion="3.8", reason="figures need matplotlib (a dependency of convsweep)")

EXPERIMENT = "lenet86-input"
GPU = "NVIDIA H100 80GB HBM3"
COMMIT = "def456" + "1" * 34
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FORMATS = ("fp32", "fp16", "u8", "u8-source")
BATCHES = (100, 1000, 10000)
# Bytes an image crosses the bus as in each format (LeNet-86's 86x86 input; u8-source: MNIST's 28x28 digits).
IMAGE_BYTES = {"fp32": 86 * 86 * 4, "fp16": 86 * 86 * 2, "u8": 86 * 86, "u8-source": 28 * 28}
H2D_GBPS, DTOD_GBPS = 50.0, 3000.0  # the rates a made-up bench measured on the GPU
DEVICE_MS_PER_IMAGE = 2e-5


def floor_ms(fmt: str, batch: int, device_ms_per_image: float = DEVICE_MS_PER_IMAGE) -> float:
    """One chunk (nothing overlaps) and no logits: the shipped bytes up at the H2D rate, then the compute."""
    return IMAGE_BYTES[fmt] * batch / (H2D_GBPS * 1e9) * 1e3 + device_ms_per_image * batch


def forward_ms(fmt: str, batch: int) -> float:
    """A made-up end to end: 40 % over the floor, and a launch's worth of fixed cost."""
    return 1.4 * floor_ms(fmt, batch) + 0.05


def run(fmt: str, batch: int, forward: float, device_ms_per_image: float | None = DEVICE_MS_PER_IMAGE,
        variant: str = "fp16_fused_network", streams: int = 4, status: str = "ok", experiment: str = EXPERIMENT) -> dict:
    """One measurement of lenet86-input's kind (graph timer, pinned memory) in input format `fmt`, with its
    end to end and what its floor is reckoned from: the bytes it shipped and a conv layer whose bytes take
    `device_ms_per_image` at the device copy rate (None: a file from before the pass's bytes were recorded)."""
    result = make_result(variant, batch, streams=streams, status=status, experiment=experiment,
                         host_memory="pinned", started_at="2026-11-26T10:00:00+00:00",
                         git={"commit": COMMIT, "dirty": False}, profiler="events")
    spec = result["spec"]
    spec.update(timer="graph", profiler="events")
    if fmt != "fp32":  # a spec leaves an axis out at its default, as the planner writes it
        spec["input_format"] = fmt
    result["run_key"] = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    result["measurement_id"] = uuid.uuid4().hex
    result["timings"]["forward_ms"] = forward
    if device_ms_per_image is not None:
        result["images"].update(input_bytes=IMAGE_BYTES[fmt] * batch, logits_bytes=0, tail_images=batch)
        result["floors"] = {"conv1": {"bytes": round(device_ms_per_image * batch * 1e-3 * DTOD_GBPS * 1e9), "flops": 0}}
    return result


def matrix(formats=FORMATS, floors: bool = True, experiment: str = EXPERIMENT) -> list[dict]:
    """The default sweep's lenet86-input: one run per format and batch."""
    return [run(fmt, batch, forward_ms(fmt, batch), DEVICE_MS_PER_IMAGE if floors else None, experiment=experiment)
            for fmt in formats for batch in BATCHES]


def stored(url: str, results: list[dict]) -> str:
    """The results, and the GPU's rates as `convsweep bench` stores them."""
    engine = open_store(url)
    for result in results:
        ingest_result(engine, result, None)
    ingest_result(engine, {"format": "bench-2", "bench_id": uuid.uuid4().hex, "device": GPU,
                           "measured_at": "2026-11-26T09:00:00+00:00",
                           "ceilings": {"dtod_GBps": DTOD_GBPS, "h2d_GBps": H2D_GBPS}}, None)
    engine.dispose()
    return url


def caption(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts).replace("\n", " ")


def lines(fig) -> dict:
    return {ln.get_label(): ln for ln in fig.axes[0].get_lines()}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return stored(f"sqlite:///{tmp_path_factory.mktemp('formats') / 'results.sqlite'}", matrix())


def test_each_format_is_a_solid_line_of_its_end_to_end_and_a_dashed_one_of_its_floor(db_url):
    fig = figure("formats", EXPERIMENT, stored(db_url, matrix()))
    drawn = lines(fig)
    assert list(drawn) == [label for fmt in FORMATS for label in (fmt, f"{fmt} floor")]
    for fmt in FORMATS:
        measured, floor = drawn[fmt], drawn[f"{fmt} floor"]
        assert measured.get_linestyle() == "-" and measured.get_marker() not in (None, "", "None")
        assert floor.get_linestyle() == "--" and floor.get_color() == measured.get_color()
        assert list(measured.get_xdata()) == list(floor.get_xdata()) == list(BATCHES)
        assert list(measured.get_ydata()) == pytest.approx([forward_ms(fmt, b) for b in BATCHES])
        assert list(floor.get_ydata()) == pytest.approx([floor_ms(fmt, b) for b in BATCHES])
    assert len({drawn[fmt].get_color() for fmt in FORMATS}) == len(FORMATS)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "batch (images)" and ax.get_ylabel() == "end-to-end time (ms, log scale)"
    assert fig.get_suptitle() == f"End-to-end time by input format: {EXPERIMENT}"
    text = caption(fig)
    assert f"Measured on {GPU} on 2026-11-26, at commit {COMMIT[:10]}" in text
    assert f"12 runs of experiment {EXPERIMENT}" in text and "CUDA graph" in text
    assert "shipped bytes up at the GPU's measured host-to-device rate" in text
    assert "the fastest is shown" not in text  # one run a cell


def test_the_fastest_ok_run_of_a_cell_is_drawn_with_its_own_floor(tmp_path):
    fast, floor = 0.5 * forward_ms("u8", 1000), floor_ms("u8", 1000, 0.5 * DEVICE_MS_PER_IMAGE)
    url = stored(f"sqlite:///{tmp_path / 'db.sqlite'}", [
        *matrix(),
        run("u8", 1000, 3 * forward_ms("u8", 1000), streams=1),  # slower
        run("u8", 1000, fast, 0.5 * DEVICE_MS_PER_IMAGE, variant="fp16_sliding_window"),  # the fastest ok run
        run("u8", 1000, 0.01, 0.5 * DEVICE_MS_PER_IMAGE, variant="tf32_sliding_window", status="incorrect"),
    ])
    rows = format_rows(url, EXPERIMENT)
    assert len(rows) == 14 and {r["input_format"] for r in rows} == set(FORMATS)
    assert {"forward_ms", "forward_floor_ms", "timer", "streams", "gpu", "git_commit"} <= set(rows[0])
    fig = figure("formats", EXPERIMENT, url)
    drawn = lines(fig)
    assert list(drawn["u8"].get_ydata()) == pytest.approx([forward_ms("u8", 100), fast, forward_ms("u8", 10000)])
    assert list(drawn["u8 floor"].get_ydata()) == pytest.approx([floor_ms("u8", 100), floor,
                                                                 floor_ms("u8", 10000)])
    assert list(drawn["fp32"].get_ydata()) == pytest.approx([forward_ms("fp32", b) for b in BATCHES])
    text = caption(fig)
    assert "the fastest is shown" in text and f"14 runs of experiment {EXPERIMENT}" in text


@pytest.mark.parametrize("results, why", [
    (matrix(formats=("fp32",), experiment="one-format"),
     r"experiment 'one-format' has ok runs in one input format only \(fp32\).*`input` key in experiments.yaml"),
    (matrix(floors=False, experiment="no-floors"),
     r"experiment 'no-floors' stores no forward floors.*convsweep bench --ceilings-only --db"),
], ids=["one-format", "no-floors"])
def test_one_format_or_no_floors_is_one_line_of_missing_data(tmp_path, results, why):
    experiment = results[0]["spec"]["experiment"]
    url = stored(f"sqlite:///{tmp_path / 'db.sqlite'}", results)
    with pytest.raises(MissingData, match=why) as caught:
        plot("formats", url=url, experiment=experiment, out=tmp_path / "figures")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "figures").exists()
    done = plot("all", url=url, experiment=experiment, out=tmp_path / "all")  # the others draw; this one skips
    assert "formats" in [kind for kind, _ in done.skipped] and "formats.png" not in [p.name for p in done.paths]


def test_cli_plot_formats_writes_a_png(url, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "plot", "formats", "--experiment", EXPERIMENT,
                           "--db", url, "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(tmp_path / "formats.png")]
    data = (tmp_path / "formats.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
