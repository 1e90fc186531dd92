"""The result file as a typed record: what jobs write reads back as it was, older formats upgrade, the
record and the result schema name the same keys, and a measurement names the store's columns."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from convsweep.sweep.config import JobSpec, RunSpec
from convsweep.measure.job import run_job
from convsweep.measure.record import (FORMAT, GridPlace, Measurement, ResultFile, Sample, SettingCounts, Stopping, Timings,
                              build_key)
from convsweep.base.schema import load_schema
from fake_gpu import FAKE
from store_fixtures import INTEGRITY_FIXTURES, as_format_1, integrity_results, make_job_file, make_result

FIXTURES = sorted(Path(__file__).parent.glob("fixtures/gpu-results/*.json")) + sorted(INTEGRITY_FIXTURES.glob("*.json"))
SWEEP = {"experiment": "t", "config_hash": "h", "config_path": "x.yaml"}


def job_files() -> list[dict]:
    """Format 3 files: the fixtures' and the factory's."""
    found = [data for path in FIXTURES if (data := json.loads(path.read_text()))["format"] == 3]
    assert found
    return found + [make_job_file()]


@pytest.mark.parametrize("data", job_files(), ids=lambda data: data["job_id"][:40])
def test_a_job_file_reads_back_as_it_was(data):
    kept = copy.deepcopy(data)
    assert ResultFile.from_json(data).to_json() == kept
    assert data == kept  # reading leaves the file's dict as it was


def test_what_a_job_writes_is_its_record_and_reads_back_key_for_key(tmp_path):
    """A CPU job, and a grid over a fake GPU with a failed setting: the file holds the record run_job
    returns, and reading it gives the same keys in the same order."""
    cpu = JobSpec.for_run(RunSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                                  variants={"conv1": "reference", "conv2": "reference"},
                                  params={"conv1": {}, "conv2": {}}, batch=8, streams=1, host_memory="pageable",
                                  repeats=2, warmup=0, profiler="events"), sweep=SWEEP)
    grid = JobSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                   variants={"conv1": "naive", "conv2": "naive"},
                   grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64, 128]}}], batch=8, streams=1,
                   host_memory="pageable", repeats=2, warmup=0, profiler="events", sweep=SWEEP)
    for job, backend in ((cpu, None), (grid, FAKE)):
        out = tmp_path / f"{job.job_id}.json"
        written = run_job(job, out, backend=backend)
        text = out.read_text()
        assert json.dumps(written.to_json(), indent=1) + "\n" == text
        assert json.dumps(ResultFile.from_json(json.loads(text)).to_json(), indent=1) + "\n" == text


def test_a_format_2_file_is_its_one_measurement():
    data = make_result()
    result = ResultFile.from_json(data)
    [(where, measurement)] = result.located()
    assert where == "" and (result.format, result.job_key, result.settings) == (2, None, None)
    assert measurement.measurement_id == data["measurement_id"] and measurement.grid is None
    assert measurement.timings.op_time_ms == {"conv1": 0.74, "conv2": 1.76}
    assert result.to_json() == data


def test_a_format_1_file_is_named_by_its_run_key_and_keeps_its_commit_in_the_environment():
    data = as_format_1(make_result())
    [measurement] = ResultFile.from_json(data).measurements
    assert measurement.measurement_id == measurement.run_key == data["run_key"]
    assert measurement.git == {"commit": data["environment"]["git_commit"], "dirty": None}
    assert measurement.sources is None and measurement.clocks is None
    newer = Measurement.upgraded(make_result(), 2)  # the commit is part of format 1's environment, as it always was
    assert measurement.environment_columns()["env_hash"] != newer.environment_columns()["env_hash"]


def test_a_job_file_lists_its_measurements_by_key_path():
    result = ResultFile.from_json(make_job_file())
    assert [where for where, _ in result.located()] == ["measurements[0].", "measurements[1].", "measurements[2]."]
    assert result.settings == SettingCounts(valid=3, measured=3, resumed=0)
    assert all(m.grid.job_key == result.job_key for m in result.measurements)


def test_a_new_measurement_is_failed_until_measured_and_gains_the_keys_set_since():
    grid = GridPlace("k", 0, 1, 1, {"strategy": "grid"})
    m = Measurement.new("job", "run", {"params": {"conv1": {"BLOCK": 64}}}, SWEEP, {"commit": None, "dirty": None},
                        {}, grid)
    written = m.to_json()
    assert written["status"] == "failed" and written["grid"] == grid.to_json() and len(written["measurement_id"]) == 32
    assert written["timings"] == {"op_time_ms": {}, "h2d_ms": None, "d2h_ms": None, "compute_ms": None,
                                  "forward_ms": None, "overlap": None, "streams_used": None, "total_s": None,
                                  "compile_ms": None}
    assert (written["samples"], written["phases_s"], written["files"]) == ([], {}, {})
    assert "prediction_agreement" not in written and "profiler_note" not in written
    m.prediction_agreement = None  # checked, without labels: written as null, after the keys it always had
    m.timings.event_forward_ms = 1.5
    assert list(m.to_json())[-1] == "prediction_agreement" and m.to_json()["prediction_agreement"] is None
    assert m.to_json()["timings"]["event_forward_ms"] == 1.5
    assert m.params == {"conv1": {"BLOCK": 64}}


def test_a_file_without_a_key_is_written_without_it_until_it_is_set():
    data = make_result()
    del data["clocks"], data["timings"]["overlap"]
    m = Measurement.upgraded(data, 2)
    assert "clocks" not in m.to_json() and "overlap" not in m.to_json()["timings"]
    m.clocks = {"sm_mhz": 1, "memory_mhz": 2}
    assert m.to_json()["clocks"] == {"sm_mhz": 1, "memory_mhz": 2}


# -- the schema and the record name the same keys --------------------------------------------------
def property_names(schema: dict) -> set[str]:
    return set(schema["properties"])


def names(record: type) -> set[str]:
    return {f.name for f in fields(record)}


def test_the_record_and_the_result_schema_name_the_same_keys():
    defs = load_schema("result")["$defs"]
    measurement = defs["measurement"]["properties"]
    assert names(Measurement) == set(measurement)
    assert names(Timings) == property_names(defs["timings"])
    assert names(Sample) == property_names(measurement["samples"]["items"])
    assert names(GridPlace) == property_names(measurement["grid"])
    assert names(Stopping) == property_names(measurement["stopping"])
    assert names(ResultFile) == property_names(defs["job"]) | {"format"}
    assert names(SettingCounts) == property_names(defs["job"]["properties"]["settings"])
    assert FORMAT == load_schema("result")["properties"]["format"]["enum"][-1]


# -- the store's columns ----------------------------------------------------------------------------
STORE_SETS = {"id", "sweep_id", "environment_id", "ingested_at", "result_path",
              "ceiling_id", "compute_floor_ms", "forward_floor_ms"}  # the floors: at the GPU's stored rates
LAYER_STORE_SETS = {"floor_ms"}


def column_names(model) -> set[str]:
    return {column.name for column in model.__table__.columns}


@pytest.mark.parametrize("data", [*job_files()[:3], integrity_results()[0], make_result(),
                                  make_result(status="failed")],
                         ids=["fixture-0", "fixture-1", "fixture-2", "integrity", "format-2", "format-2-failed"])
def test_a_measurement_names_every_run_column_but_those_the_store_sets(data):
    from convsweep.store.models import Run

    for measurement in ResultFile.from_json(data).measurements:
        assert set(measurement.run_columns()) == column_names(Run) - STORE_SETS


def test_child_rows_name_columns_of_their_tables():
    from convsweep.store import models

    m = Measurement.upgraded(make_result(throttle={"reasons": ["sw_power_cap"], "repeats": [1]}), 2)
    owned = {"run_id", "id"}
    for rows, model in ((m.sample_rows(), models.Sample), (m.kernel_rows(), models.KernelStat),
                        (m.memcpy_rows(), models.Memcpy), (m.layer_time_rows(), models.LayerTime),
                        (m.phase_rows(), models.Phase), (m.build_rows(), models.Build)):
        stored = owned | (LAYER_STORE_SETS if model is models.LayerTime else set())
        assert rows and all(set(row) == column_names(model) - stored for row in rows), model.__name__
    assert set(m.environment_columns()) == column_names(models.Environment) - owned
    assert set(m.sweep_columns()) == column_names(models.Sweep) - owned - {"created_at"}
    assert [row["throttled"] for row in m.sample_rows() if row["metric"] == "forward_ms"] == [False, True, False]
    assert m.build_rows()[0]["build_key"] == build_key(m.builds[0])


def test_the_record_imports_no_database_code():
    code = "import sys, convsweep.measure.record; print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
