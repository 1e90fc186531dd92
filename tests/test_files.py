"""The files beside the result file as typed records (convsweep/measure/files.py): each reads back from its JSON as
it was built, its writer goes through it, its rows name the store's columns; and ingest's table of formats
(convsweep.store.ingest.FORMATS) has an entry for every file record, each stored once by its id."""
from __future__ import annotations

import copy
import importlib
import json
import pkgutil
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

import convsweep.measure
from convsweep.base.errors import StoreError
from convsweep.bench import report
from convsweep.measure.confirm import ConfirmSpec, run_confirm_job
from convsweep.measure.files import (CONFIRM_FORMAT, PROFILE_FORMAT, BenchFile, ConfirmCandidate, ConfirmFile,
                                     LayerVerdict, ProfiledSetting, ProfileFile, VerdictEntry)
from convsweep.measure.ncu import METRICS, LaunchProfile, run_profile_job
from convsweep.measure.record import File, ResultFile
from convsweep.store import ingest_result, open_store
from convsweep.store.ingest import FORMATS, KNOWN_FORMATS
from convsweep.store.models import Confirmation, DeviceCeiling, KernelProfile

from store_fixtures import every_layer, make_confirmation, make_job_file, make_result
from test_bench import fake_measurements
from test_confirm import grid_job
from test_ncu import job as ncu_job

SWEEP = {"experiment": "t", "config_hash": "h" * 64, "config_path": "x.yaml"}
GPU = "NVIDIA H100 80GB HBM3"


def built(monkeypatch, record: type[File], method: str = "write") -> list[File]:
    """The records of `record`'s kind that call `method` from now on (which still does what it did)."""
    seen: list[File] = []
    original = getattr(record, method)

    def spy(self, *args):
        seen.append(self)
        return original(self, *args)

    monkeypatch.setattr(record, method, spy)
    return seen


def bench_record(monkeypatch, ceilings_only: bool = False) -> BenchFile:
    """What build_result builds from the bench tests' fake numbers (with them, the rates alone and no matmul)."""
    meas = {**fake_measurements(), "bench_id": uuid.uuid4().hex, "measured_at": "2026-11-26T06:00:00+00:00"}
    if ceilings_only:
        meas = {k: v for k, v in meas.items() if k not in ("convs", "forward", "end_to_end", "cudnn", "harness")}
        meas["ceilings"].pop("matmul_TFLOPps")
    records = built(monkeypatch, BenchFile, "to_json")
    report.build_result(meas, {"batch": 10000, "ms": {}})
    [record] = records
    return record


def profile_record(ok: bool = True) -> ProfileFile:
    launch = LaunchProfile(1, "conv2", "conv_forward", 0, {**dict.fromkeys(METRICS), "duration_ns": 191_000.0,
                                                             "dram_pct": 91.0, "static_shared_bytes": 0.0,
                                                             "dynamic_shared_bytes": 1024.0, "registers": 40.0},
                           [{"reason": "long_scoreboard", "share": 0.62}])
    return ProfileFile(format=PROFILE_FORMAT, profile_id=uuid.uuid4().hex, job_id="j", job_key="k" * 64,
                       job={"variants": {"conv1": "naive", "conv2": "naive"}, "batch": 100}, sweep=SWEEP,
                       git={"commit": "c" * 40, "dirty": False}, status="ok" if ok else "skipped",
                       reason=None if ok else "ncu exited with 1", ncu="2099.1.0", environment={"gpu": GPU},
                       started_at="2026-11-22T19:00:00+00:00", seconds=1.5, files={},
                       settings=[ProfiledSetting(i, f"r{i}", every_layer(BLOCK=64 * (i + 1))) for i in range(2)],
                       profiles=[launch.profiled()] if ok else [])


def confirm_record(ok: bool = True) -> ConfirmFile:
    record = ConfirmFile(format=CONFIRM_FORMAT, confirmation_id=uuid.uuid4().hex, experiment="t",
                         group_id="winners-b8-s1-0123456789", batch=8, top=2, rounds=3,
                         started_at="2026-11-26T12:00:00.000+00:00", status="skipped", candidates=[], layers=[])
    if ok:
        record.status, record.environment = "ok", {"gpu": GPU}
        record.clocks = record.clocks_after = {"sm_mhz": 1980, "memory_mhz": 2619}
        record.inputs, record.freshness = {"seed": "0123456789abcdef"}, {"counted": 3, "stale_rounds": 0}
        record.candidates = [ConfirmCandidate(measurement_id=mid, job_id="j", run_key=f"r{mid}", variant="naive",
                                              variants={"conv1": "naive"}, params=every_layer(BLOCK=64), status="ok")
                             for mid in ("a", "b")]
        record.layers = [LayerVerdict("conv1", 0, False, [
            VerdictEntry(measurement_id="a", first_place=1, first_ms=1.0, place=1, standing="winner", median_ms=1.0,
                         spread=0.01, detectable_ms=0.002, samples_ms=[1.0, 1.0, 1.01]),
            VerdictEntry(measurement_id="b", first_place=2, first_ms=1.1, place=2, standing="slower", median_ms=1.1,
                         spread=0.01, difference_ms=0.1, p_value=0.01, detectable_ms=0.002, samples_ms=[1.1] * 3)])]
    else:
        record.reason = "1 correct setting(s) with op times: nothing to tell apart"
    record.total_s = 0.5
    return record


BUILDERS = {"bench": bench_record, "bench-ceilings-only": lambda mp: bench_record(mp, ceilings_only=True),
            "profile": lambda mp: profile_record(), "profile-skipped": lambda mp: profile_record(ok=False),
            "confirm": lambda mp: confirm_record(), "confirm-skipped": lambda mp: confirm_record(ok=False)}


@pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS)
def test_a_record_reads_back_from_its_json_as_it_was_built(build, monkeypatch, tmp_path):
    record = build(monkeypatch)
    record.write(tmp_path / "built.json")
    text = (tmp_path / "built.json").read_text()
    read = type(record).from_json(json.loads(text))
    assert read == record
    read.write(tmp_path / "read.json")
    assert (tmp_path / "read.json").read_text() == text


def test_a_record_writes_only_the_keys_it_has():
    """A skipped confirmation never ran its rounds; a bench without PyTorch has no matmul rates; a bench file
    that lacks keys (it has no schema) reads back without them."""
    assert not {"environment", "clocks", "clocks_after", "inputs", "freshness"} & set(confirm_record(ok=False).to_json())
    assert list(confirm_record().to_json())[-3:] == ["candidates", "layers", "total_s"]
    minimal = {"format": "bench-2", "bench_id": "b" * 32, "device": GPU, "ceilings": {"dtod_GBps": 3000.0}}
    assert BenchFile.from_json(minimal).to_json() == minimal


def test_the_bench_without_pytorch_writes_no_matmul_rates(monkeypatch):
    assert "matmul_TFLOPps" not in bench_record(monkeypatch, ceilings_only=True).to_json()["ceilings"]
    assert "matmul_TFLOPps" in bench_record(monkeypatch).to_json()["ceilings"]


# -- each writer goes through its record ------------------------------------------------------------------
def test_the_bench_builds_its_file_as_its_record(monkeypatch):
    records = built(monkeypatch, BenchFile, "to_json")
    result = report.build_result(fake_measurements(), {"batch": 10000, "ms": {}})
    [record] = records
    assert json.dumps(result) == json.dumps(record.to_json())


def test_the_profile_job_writes_its_file_through_its_record(monkeypatch, tmp_path):
    monkeypatch.setenv("NCU", str(tmp_path / "nowhere" / "ncu"))  # no ncu and `ncu: auto`: a skipped profile
    monkeypatch.setenv("PATH", str(tmp_path))
    records = built(monkeypatch, ProfileFile)
    out = tmp_path / "ncu" / "job.json"
    result = run_profile_job(ncu_job(), out, required=False)
    [record] = records
    record.write(tmp_path / "again.json")
    assert out.read_bytes() == (tmp_path / "again.json").read_bytes() and result == record.to_json()


def test_the_confirm_job_writes_its_file_through_its_record(monkeypatch, tmp_path):
    job = grid_job()
    records = built(monkeypatch, ConfirmFile)
    out = tmp_path / "winners" / "w.json"
    result = run_confirm_job(ConfirmSpec("t", job.winners_id, job.to_dict(), [], 3, 10), out)  # no settings: skipped
    [record] = records
    record.write(tmp_path / "again.json")
    assert out.read_bytes() == (tmp_path / "again.json").read_bytes() and result == record.to_json()
    assert record.status == "skipped"


# -- the store's rows ---------------------------------------------------------------------------------
def columns(model) -> set[str]:
    return {column.name for column in model.__table__.columns}


def test_each_record_names_the_columns_of_its_rows_but_those_the_store_sets(monkeypatch):
    [row] = profile_record().kernel_profile_rows()
    assert set(row) == columns(KernelProfile) - {"id", "profiled_at", "ingested_at"}
    assert row["run_key"] == "r1" and row["shared_bytes"] == 1024 and row["duration_ms"] == pytest.approx(0.191)
    rows = confirm_record().confirmation_rows({"a": 1, "b": 2})
    assert [set(r) for r in rows] == [columns(Confirmation) - {"id", "confirmed_at", "ingested_at"}] * 2
    assert [(r["run_id"], r["standing"], r["rounds"]) for r in rows] == [(1, "winner", 3), (2, "slower", 3)]
    bench = bench_record(monkeypatch)
    assert set(bench.ceiling_columns()) == columns(DeviceCeiling) - {"id", "source", "ingested_at"}


def test_a_launch_or_entry_the_file_cannot_place_is_named():
    profile = profile_record()
    profile.profiles[0].setting = 7
    assert profile.unplaced() == 0
    confirmation = confirm_record()
    confirmation.layers[0].entries[1].measurement_id = "z"
    assert confirmation.stray_entry() == "layers[0].entries[1]"


# -- ingest's table of formats ----------------------------------------------------------------------------
def file_records() -> set[type[File]]:
    """Every record of a whole file: File's subclasses, once each module of convsweep.measure (where both a
    file's writer and the store may import its record) is imported."""
    for module in pkgutil.iter_modules(convsweep.measure.__path__):
        importlib.import_module(f"convsweep.measure.{module.name}")
    found, todo = set(), [File]
    while todo:
        for record in todo.pop().__subclasses__():
            found.add(record)
            todo.append(record)
    return found


def test_ingest_has_an_entry_for_every_file_the_package_writes():
    """A new file record (or a new format of one) without an entry in FORMATS fails here."""
    assert {entry.record for entry in FORMATS} == file_records()
    assert all(entry.record.FORMATS for entry in FORMATS)
    assert len(KNOWN_FORMATS) == len(set(KNOWN_FORMATS))  # each format looked up to one entry
    assert ResultFile.FORMATS == (1, 2, 3) and BenchFile.FORMATS == ("bench-2",)


def test_a_format_no_entry_has_is_one_line_naming_the_file_and_every_format(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        for document, got in (({"format": "bench-1", "bench_id": "b"}, '"bench-1"'), ({"format": True}, "true")):
            with pytest.raises(StoreError) as refused:
                ingest_result(engine, document, "old.json")
            assert str(refused.value) == ("old.json: format: expected one of "
                                          f"[1, 2, 3, 'ncu-1', 'confirm-1', 'bench-2'], got {got}")
    finally:
        engine.dispose()


def samples(record: type[File]) -> tuple[list[dict], dict, set[str]]:
    """A file of this kind, what must be stored before it, and the ids its id column holds once it is."""
    if record is ResultFile:
        job_file = make_job_file()
        return [], job_file, {m["measurement_id"] for m in job_file["measurements"]}
    if record is ProfileFile:
        profile = profile_record().to_json()
        return [], profile, {profile["profile_id"]}
    if record is ConfirmFile:
        job_file = make_job_file([make_result("naive", 100, params=every_layer(BLOCK=block), op_time_ms=(ms, 0.7))
                                  for block, ms in ((32, 0.3), (64, 0.4))])
        confirmation = make_confirmation(job_file)
        return [job_file], confirmation, {confirmation["confirmation_id"]}
    bench = report.build_result({**fake_measurements(), "bench_id": "b" * 32,
                                 "measured_at": "2026-11-26T06:00:00+00:00"}, {})
    return [], bench, {"b" * 32}


@pytest.mark.parametrize("entry", FORMATS, ids=lambda entry: entry.record.__name__)
def test_each_format_is_stored_once_by_its_id_column(db_url, entry):
    before, document, ids = samples(entry.record)
    engine = open_store(db_url)
    try:
        for other in before:
            ingest_result(engine, other, None)
        first = ingest_result(engine, document, "first.json")
        again = ingest_result(engine, copy.deepcopy(document), "again.json")
        assert first.added > 0 and (again.added, again.unchanged) == (0, first.added)
        with Session(engine) as session:
            assert set(session.scalars(select(entry.id_column).distinct())) == ids
    finally:
        engine.dispose()
