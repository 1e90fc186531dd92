"""Floors at measured rates (convsweep.device.floors): the arithmetic, and the store's device_ceiling rows and
the floors every run on that GPU gets from them (convsweep.store.ceilings), on SQLite and PostgreSQL."""
from __future__ import annotations

import copy
import json
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from convsweep.base.errors import StoreError
from convsweep.device.floors import Ceiling, Work, compute_floor_ms, fastest_unit, forward_floor_ms, times_floor, work_floor_ms
from convsweep.analysis.query import run_query
from convsweep.store import DeviceCeiling, Run, ingest_result, open_store

from store_fixtures import as_reader, make_result

H100 = "NVIDIA H100 80GB HBM3"  # store_fixtures' GPU
RATES = Ceiling(H100, 3.0e12, 50e9, 40e9, {"fp32": 50e12, "tf32": 400e12, "fp16": 700e12})


# -- arithmetic --------------------------------------------------------------------------------------
def test_a_work_floor_is_its_bytes_or_its_flops_on_its_unit_whichever_is_longer():
    assert work_floor_ms(RATES, Work(3_000_000_000)) == pytest.approx(1.0)  # 3 GB at 3 TB/s
    assert work_floor_ms(RATES, Work(3_000_000, 100e9, "fp32")) == pytest.approx(2.0)  # 100 GFLOP at 50 TFLOP/s
    assert work_floor_ms(RATES, Work(3_000_000, 100e9, "fp16")) == pytest.approx(100 / 700)
    # A unit the bench did not measure counts at the fastest it did: a floor errs low, never high.
    assert work_floor_ms(RATES, Work(3_000_000, 100e9, "int8")) == pytest.approx(100 / 700)
    assert work_floor_ms(Ceiling(None, 3e12), Work(3_000_000, 100e9, "fp32")) == pytest.approx(0.001)
    assert work_floor_ms(RATES, Work(None, 1)) is None


def test_the_compute_of_several_layers_sums_bytes_and_each_layers_flops_at_its_rate():
    works = [Work(3_000_000, 50e9, "fp32"), Work(3_000_000, 70e9, "fp16")]
    assert compute_floor_ms(RATES, works) == pytest.approx(1.0 + 0.1)
    assert compute_floor_ms(RATES, [Work(6e12, 1, "fp16"), Work(3e12)]) == pytest.approx(3000.0)
    assert compute_floor_ms(RATES, []) is None


def test_the_host_to_host_floor_is_a_pipeline_of_up_compute_and_down():
    up, down = 5.0, 0.5  # 250 MB at 50 GB/s, 20 MB at 40 GB/s
    assert forward_floor_ms(RATES, 250_000_000, 20_000_000, 1.0) == pytest.approx(up + 1.0 + down)  # one chunk
    # Eight chunks: the longest stage, plus an eighth of the other two (the head and the tail).
    assert forward_floor_ms(RATES, 250_000_000, 20_000_000, 1.0, 1 / 8) == pytest.approx(up + (1.0 + down) / 8)
    # Compute-bound: the compute, plus an eighth of the copies.
    assert forward_floor_ms(RATES, 250_000_000, 20_000_000, 9.0, 1 / 8) == pytest.approx(9.0 + (up + down) / 8)
    no_d2h = Ceiling(H100, 3e12, 50e9)
    assert forward_floor_ms(no_d2h, 0, 50_000_000, 0.0) == pytest.approx(1.0)  # down at the H2D rate
    assert forward_floor_ms(Ceiling(H100, 3e12), 1, 1, 1.0) is None  # no H2D rate: no floor, not a guess
    assert forward_floor_ms(RATES, None, 1, 1.0) is None


def test_times_floor_and_the_fastest_unit():
    assert times_floor(1.2, 1.0) == pytest.approx(1.2)
    assert times_floor(None, 1.0) is None and times_floor(1.0, None) is None and times_floor(1.0, 0.0) is None
    assert fastest_unit(["fp32", "fp16", "tf32"]) == "fp16" and fastest_unit(["fp32"]) == "fp32"
    assert fastest_unit([]) is None


# -- the store -----------------------------------------------------------------------------------------
def bench_file(dtod=3000.0, h2d=50.0, d2h=40.0, gpu=H100, at="2026-11-26T06:00:00+00:00", **matmul) -> dict:
    """What `convsweep bench --json` writes, as far as the store reads it."""
    return {"format": "bench-2", "bench_id": uuid.uuid4().hex, "measured_at": at, "device": gpu,
            "environment": {"gpu": gpu, "gpu_uuid": "GPU-1", "hostname": "node1"},
            "ceilings": {"dtod_GBps": dtod, "h2d_GBps": h2d, "d2h_GBps": d2h,
                         "matmul_TFLOPps": matmul or {"fp32": 50.0, "tf32": 400.0, "fp16": 700.0}}, "rows": []}


def shipped(result: dict, fmt_bytes: int = 1) -> dict:
    """A result as this version writes it: what the pass moved and each layer's unit."""
    batch = result["spec"]["batch"]
    result["images"].update(input_bytes=batch * 86 * 86 * fmt_bytes, logits_bytes=batch * 40, tail_images=batch // 4)
    for work in result["floors"].values():
        work["unit"] = "fp32"
    return result


def expected(run: Run, rates: Ceiling) -> tuple[float, float]:
    works = [Work(w["bytes"], w["flops"], w.get("unit")) for w in run.floors.values()]
    compute = compute_floor_ms(rates, works)
    return compute, forward_floor_ms(rates, run.shipped_bytes, run.logits_bytes, compute, run.tail_images / run.batch)


def test_a_bench_file_gives_every_run_on_its_gpu_floors_and_later_runs_theirs(db_url):
    engine = open_store(db_url)
    try:
        early = shipped(make_result("naive", 1000))
        elsewhere = shipped(make_result("naive", 100))
        elsewhere["environment"] = {**elsewhere["environment"], "gpu": "NVIDIA A100-SXM4-80GB"}
        for result in (early, elsewhere):
            ingest_result(engine, result)
        with Session(engine) as session:
            assert session.scalars(select(Run.forward_floor_ms)).all() == [None, None]  # no rates yet

        bench = bench_file()
        assert ingest_result(engine, bench, "bench.json").added == 1
        assert ingest_result(engine, copy.deepcopy(bench), "bench.json").unchanged == 1  # the same file again
        late = shipped(make_result("tiled", 1000))
        ingest_result(engine, late)
        with Session(engine) as session:
            runs = {run.measurement_id: run for run in session.scalars(select(Run))}
            ceiling = session.scalars(select(DeviceCeiling)).one()
            assert (ceiling.gpu, ceiling.dtod_gbps, ceiling.fp16_tflops, ceiling.source) == (H100, 3000.0, 700.0, "bench.json")
            for key in (early["measurement_id"], late["measurement_id"]):
                run = runs[key]
                compute, forward = expected(run, RATES)
                assert run.ceiling_id == ceiling.id and run.compute_floor_ms == pytest.approx(compute)
                assert run.forward_floor_ms == pytest.approx(forward) and forward > compute
                for lt in run.layer_times:
                    work = run.floors[lt.layer]
                    assert lt.floor_ms == pytest.approx(work_floor_ms(RATES, Work(work["bytes"], work["flops"], "fp32")))
            other = runs[elsewhere["measurement_id"]]
            assert (other.ceiling_id, other.forward_floor_ms, other.layer_times[0].floor_ms) == (None, None, None)

        # Measured again, faster: every run on that GPU is reckoned at the newer rates.
        ingest_result(engine, bench_file(dtod=6000.0, h2d=100.0, d2h=80.0, at="2026-11-27T06:00:00+00:00"))
        faster = Ceiling(H100, 6e12, 100e9, 80e9, RATES.flops_per_s)
        with Session(engine) as session:
            run = session.scalars(select(Run).where(Run.measurement_id == early["measurement_id"])).one()
            assert run.forward_floor_ms == pytest.approx(expected(run, faster)[1])

        # The summary's "forward × floor" divides by it.
        rows = json.loads(run_query(as_reader(db_url), "summary", fmt="json"))
        shown = {(r["variant"], r["batch"]): r["forward × floor"] for r in rows}
        with Session(engine) as session:
            run = session.scalars(select(Run).where(Run.measurement_id == late["measurement_id"])).one()
            assert shown[("tiled", 1000)] == f"{run.forward_ms / run.forward_floor_ms:.2f}"
        assert shown[("naive", 100)] is None  # the A100's run: no rates measured there
    finally:
        engine.dispose()


@pytest.mark.parametrize("change, message", [
    (lambda b: b["ceilings"].pop("dtod_GBps"), "bench.json: ceilings.dtod_GBps: expected the device copy rate"),
    (lambda b: b["ceilings"].update(h2d_GBps=-1.0), "bench.json: ceilings.h2d_GBps: expected a positive rate, got -1.0"),
    (lambda b: b["ceilings"]["matmul_TFLOPps"].update(fp16="fast"),
     "bench.json: ceilings.matmul_TFLOPps.fp16: expected a positive rate, got 'fast'"),
    (lambda b: b.pop("device"), "bench.json: device: expected the GPU's name"),
    (lambda b: b.update(measured_at="yesterday"), "bench.json: measured_at:"),
])
def test_a_bad_bench_file_is_one_line_and_stores_nothing(db_url, change, message):
    engine = open_store(db_url)
    try:
        bench = bench_file()
        change(bench)
        with pytest.raises(StoreError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
            ingest_result(engine, bench, "bench.json")
        assert "\n" not in str(caught.value)
        with Session(engine) as session:
            assert session.scalars(select(DeviceCeiling)).all() == []
    finally:
        engine.dispose()
