"""The sweep's axes are declared once (convsweep.base.axes): the schemas, the `run` table, the specs, their
ids and hashes, the expansion, compare's cell and report's columns all carry exactly those axes."""
from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Integer, String

from convsweep.base import axes
from convsweep.analysis import compare
from convsweep import report
from convsweep.base.axes import AXES, NAMES
from convsweep.sweep.config import JobSpec, RunSpec, expand_config, load_config
from convsweep.base.errors import ConfigError
from convsweep.base.paths import QUERIES_DIR, ROOT, SCHEMAS_DIR
from convsweep.analysis.query import expand_cell
from convsweep.base.schema import load_schema, schema_file
from convsweep.store.models import Run

SPEC_DEFS = ("job_spec", "spec")  # the result schema's specs: a job's cell, a measurement's setting


def raw(name: str) -> dict:
    return yaml.safe_load((SCHEMAS_DIR / f"{name}.schema.yaml").read_text())


def test_no_schema_file_declares_an_axis_by_hand():
    experiment = raw("experiments")["$defs"]["experiment"]
    assert not {axis.key for axis in AXES} & (set(experiment["properties"]) | set(experiment["required"]))
    for definition in SPEC_DEFS:
        spec = raw("result")["$defs"][definition]
        assert not set(NAMES) & (set(spec["properties"]) | set(spec["required"]))


def test_the_experiments_schema_gains_exactly_the_axes():
    experiment = load_schema("experiments")["$defs"]["experiment"]
    added = set(experiment["properties"]) - set(raw("experiments")["$defs"]["experiment"]["properties"])
    assert added == {axis.key for axis in AXES}
    for axis in AXES:
        assert experiment["properties"][axis.key] == axis.config_schema()
        assert (axis.key in experiment["required"]) == (axis.config_default is None)
    assert experiment["required"].count("batches") == 1  # load_schema is cached: added once


def test_both_result_specs_gain_exactly_the_axes():
    for definition in SPEC_DEFS:
        spec = load_schema("result")["$defs"][definition]
        assert set(spec["properties"]) - set(raw("result")["$defs"][definition]["properties"]) == set(NAMES)
        for axis in AXES:
            assert spec["properties"][axis.name] == axis.result_schema()
            assert (axis.name in spec["required"]) == axis.required


def test_snakemakes_validate_reads_the_same_schema_from_a_file():
    path = schema_file("experiments")
    assert json.loads(path.read_text()) == load_schema("experiments")
    assert schema_file("experiments") == path  # written once per content


def test_the_run_table_has_a_column_per_axis():
    columns = Run.__table__.c
    for axis in AXES:
        column = columns[axis.name]
        assert isinstance(column.type, {int: Integer, str: String}[axis.type])
        assert column.nullable == axis.nullable
        default = None if axis.required or axis.default is None else str(axis.default)
        assert (column.server_default.arg if column.server_default is not None else None) == default
    indexes = [[c.name for c in index.columns] for index in Run.__table__.indexes]
    assert ["experiment", "variant", "batch", "streams"] in indexes


BASE = dict(experiment="e", network="networks/lenet86.yaml", dataset="mnist5k",
            variants={"conv1": "fp16_sliding_window", "conv2": "fp16_sliding_window"},
            grid=[{"layers": ["conv1", "conv2"], "values": {"PR": [1, 2]}}],
            batch=10000, streams=1, host_memory="pinned", repeats=5, warmup=1, profiler="auto")
PARAMS = {"conv1": {"PR": 2}, "conv2": {"PR": 2}}
# (changes to BASE, job id, run key of its PR=2 setting), computed by the code before the axes were declared
# once: ids, job keys and run keys must never change, or every stored result would be measured again.
KNOWN = [
    ({}, "fp16_sliding_window-b10000-s1-pinned-20c061a61a",
     "616db8c8a3fc936bbe972eb91e8172e4951e3cb21d7b090d246595e2cbfbffe6"),
    ({"cache": "cold"}, "fp16_sliding_window-b10000-s1-pinned-cold-686a36fe26",
     "86cbcd89a8ea620b5b30a72e47bd4692bf26fd78a32c39a9507c2b03363b10c6"),
    ({"chunk_images": 100}, "fp16_sliding_window-b10000-s1-c100-pinned-ee584b213a",
     "ebd710feccc793683db79410d0ec7ab628f67c2789bcf645ae4c48ee2bc5be07"),
    ({"chunk_images": 100, "cache": "cold", "streams": 2, "arch": "sm_90", "energy_window_s": 0.25,
      "stopping": {"max_noise": 0.01}, "repeats": "auto", "search": {"strategy": "random", "max_settings": 1, "seed": 3}},
     "fp16_sliding_window-b10000-s2-c100-pinned-cold-0499ad4db0",
     "9526a5a30bbc7371865cb614eea098382aff18db7c4b4251bf678689e26e274a"),
]


@pytest.mark.parametrize(("changes", "job_id", "run_key"), KNOWN)
def test_job_ids_and_hashes_are_what_they_were(changes, job_id, run_key):
    job = JobSpec(**{**BASE, **changes})
    assert job.job_id == job_id and job.job_key.startswith(job_id[-10:])
    run = RunSpec(**{k: v for k, v in job.to_dict().items() if k not in ("grid", "search", "arch")}, params=PARAMS)
    assert run.run_key == run_key
    assert JobSpec.from_dict(json.loads(json.dumps(job.to_dict()))).job_id == job_id
    # an axis at its default is left out of the dict, as before the axis existed
    assert all(name in job.to_dict() or axes.BY_NAME[name].default == getattr(job, name) for name in NAMES)


@pytest.mark.parametrize("path", [path for path in sorted((ROOT / "tests" / "fixtures" / "gpu-results").glob("*.json"))
                                  if not path.name.startswith(("ncu-", "winners-"))], ids=lambda path: path.stem)
def test_stored_job_files_keep_their_ids(path):
    result = json.loads(path.read_text())
    job = JobSpec.from_dict(result["job"])
    assert (job.job_id, job.job_key) == (result["job_id"], result["job_key"]) and path.stem == job.job_id


def test_the_expansion_is_the_product_of_the_axes(tmp_path):
    values = {"batches": [100, 1000], "streams": [1, 2], "chunk_images": ["auto", 50],
              "host_memory": ["pageable", "pinned"], "input": ["fp32", "u8-source"], "cache": ["warm", "cold"],
              "timer": ["events", "graph"]}
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": {"e": {"variants": ["naive"], "repeats": 1, **values}}}))
    jobs = expand_config(load_config(path))

    def runs(cell: dict) -> bool:  # cold: one stream; a graph: a warm L2 and page-locked memory
        return (cell["cache"] == "warm" or cell["streams"] == 1) and \
            (cell["timer"] == "events" or (cell["cache"] == "warm" and cell["host_memory"] != "pageable"))

    product = {cell for cell in itertools.product(*([axis.from_config(v) for v in values[axis.key]] for axis in AXES))
               if runs(dict(zip(NAMES, cell)))}
    assert {tuple(getattr(job, name) for name in NAMES) for job in jobs} == product
    assert len(jobs) == len(product) == 2 * (24 + 8)


def test_an_axis_value_the_experiment_rules_out_is_one_line(tmp_path):
    path = tmp_path / "experiments.yaml"
    for extra, why in [({"profiler": "nsys"}, "nsys cannot split into layers"),
                       ({"host_memory": ["pageable"]}, "a copy from pageable memory cannot be captured")]:
        exp = {"variants": ["naive"], "batches": [100], "host_memory": ["pinned"], "timer": ["graph"], **extra}
        path.write_text(yaml.safe_dump({"experiments": {"e": exp}}))
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:\d+: experiments\.e\.timer: timer graph .*{why}"):
            expand_config(load_config(path))
    path.write_text(yaml.safe_dump({"experiments": {"e": {"variants": ["reference"], "batches": [10], "host_memory": ["pinned"],
                                                          "timer": ["events", "graph"]}}}))
    assert [job.timer for job in expand_config(load_config(path))] == ["events"]  # the CPU has no graph to replay


def test_a_graph_timed_job_captures_its_pass_once_and_times_each_replay_whole(tmp_path):
    """timer graph on a fake GPU: one capture per host buffer the rounds ship from (round 0's for the seed
    pass and the warm-up, and the two the fresh rounds take turns in), every pass after it a replay; the
    forward is
    all it can time (no event inside a replay), the spec says how it was timed, and profiler auto
    times it with events, with nothing to say about nsys."""
    from fake_gpu import FAKE, FakeGpu

    from convsweep.measure.job import run_job

    run = RunSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                  variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}}, batch=40,
                  streams=2, host_memory="pinned", repeats=3, warmup=1, profiler="auto", timer="graph")
    job = JobSpec.for_run(run)
    assert job.job_id.endswith(f"-s2-pinned-graph-{job.job_key[:10]}") and run.to_dict()["timer"] == "graph"
    before = FakeGpu.captures
    m = run_job(job, tmp_path / "graph.json", backend=FAKE).measurements[0]
    assert m.status == "ok", m.error
    assert FakeGpu.captures == before + 3 and m.spec["timer"] == "graph"
    assert [s.metric for s in m.samples] == ["forward_ms"] * 3
    assert m.timings.forward_ms > 0 and m.timings.op_time_ms == {"conv1": None, "conv2": None}
    assert m.profiler == "events" and m.profiler_note is None
    assert m.run_columns()["timer"] == "graph"
    assert "timer" not in JobSpec.for_run(RunSpec(**{**run.to_dict(), "timer": "events"})).to_dict()  # old hashes


def test_compare_and_report_tell_cells_apart_by_the_axes():
    assert compare.CELL[:len(axes.CELL_COLUMNS)] == axes.CELL_COLUMNS == ("experiment", "variant", *NAMES)
    assert set(axes.CELL_COLUMNS) <= set(compare._RUN_COLUMNS.split(", "))
    assert report.CELL_COLUMNS == tuple((axis.name, axis.heading) for axis in AXES)
    assert report.SEEDS_CSV_COLUMNS[2:2 + len(AXES)] == [axis.heading for axis in AXES]
    assert axes.columns("r") in report.RUNS_SQL and axes.order_by("r") in report.RUNS_SQL
    run = {"batch": 100, "streams": 1, "chunk_images": None, "host_memory": "pinned", "input_format": "u8",
           "cache": "cold", "timer": "events"}
    assert report.cell(run) == tuple(run[name] for name in NAMES)


def test_series_are_set_apart_by_the_axes_that_describe_them():
    assert axes.series_suffix({"cache": "cold", "batch": 100}) == ", cold L2"
    assert axes.series_suffix({"cache": "warm"}) == "" and not axes.set_apart({"cache": "warm"})
    assert axes.series_suffix({"cache": "warm", "timer": "graph"}) == ", graph replay"
    assert axes.cell_text({"batch": 1000, "streams": 1, "chunk_images": 250, "host_memory": "pinned",
                           "cache": "cold"}) == "b1000 s1 c250 pinned cold"


def test_no_module_but_axes_lists_the_axes_by_hand():
    """A tuple, list or string naming most of the axes outside axes.py is a list that adding an axis
    would have to find: the figures may name the one or two axes they act on, never the cell."""
    names = set(NAMES) | {axis.key for axis in AXES}
    found = []
    for path in sorted((ROOT / "convsweep").rglob("*.py")):
        if path.name == "axes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                named = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = set(re.findall(r"\w+", node.value)) & names
            else:
                continue
            if len(named) >= len(AXES) - 1:
                found.append(f"{Path(path).relative_to(ROOT)}:{node.lineno}: {sorted(named)}")
    assert not found, "axes listed by hand:\n" + "\n".join(found)


def test_no_named_query_lists_the_axes_by_hand():
    """A named query (db/queries/*.sql) names the cell with {cell} and sorts it with {cell_order}, which the
    query runner writes out from AXES (convsweep.analysis.query.expand_cell): past its comments and those placeholders it
    may name the one or two axes its question is about (per batch, along streams, warm against cold), never
    the cell, or a new axis would be missing from it as timer was from summary."""
    found = []
    for path in sorted(QUERIES_DIR.glob("*.sql")):
        sql = re.sub(r"\{[^{}]*\}", " ", re.sub(r"--[^\n]*", " ", path.read_text(encoding="utf-8")))
        named = set(re.findall(r"\w+", sql)) & set(NAMES)
        if len(named) > 2:
            found.append(f"{path.relative_to(ROOT)}: {sorted(named)}")
    assert not found, "axes listed by hand (write {cell} or {cell_order}):\n" + "\n".join(found)


def test_the_cell_placeholders_are_the_axes():
    """What the runner writes for each placeholder: the axes' columns and their order, as report reads them."""
    assert expand_cell("{cell}") == ", ".join(NAMES) and expand_cell("{r.cell}") == axes.columns("r")
    assert expand_cell("{r.cell_order}") == axes.order_by("r")  # the order report's tables list cells in
    assert expand_cell("{cell except cache, timer}") == ", ".join(n for n in NAMES if n not in ("cache", "timer"))
    assert "streams" not in expand_cell("{w.cell_order except streams}")
    for path in sorted(QUERIES_DIR.glob("*.sql")):  # every placeholder a query writes is one the runner knows
        assert not re.search(r"\{[^{}]*cell[^{}]*\}", expand_cell(path.read_text(encoding="utf-8"), path.name))
