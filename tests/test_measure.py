"""The GPU session both measuring paths open (convsweep.measure.settings.gpu_session), on a numpy GPU: what it holds while
its block runs, and that it lets all of it go, the GPU's lock last, when the block fails."""
from __future__ import annotations

import dataclasses
import fcntl
import os

import pytest

from convsweep.sweep.config import JobSpec
from convsweep.base.errors import MachineError
from convsweep.device.gpu import no_gpu
from convsweep.device.gpulock import LOCKED_ENV, lock_path
from convsweep.inputs.batch import load_batch
from convsweep.measure.settings import gpu_session
from convsweep.model.network import load_network
from convsweep.base.paths import resolve_network_path

from fake_gpu import FAKE, FakeGpu, SlowingMonitor


def job(**over) -> JobSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"}, grid=[], batch=8, streams=2, host_memory="pageable",
                repeats=3, warmup=1, profiler="events")
    return JobSpec(**{**base, **over})


def lock_held() -> bool:
    """Whether some holder has the fake GPU's lock (flock: another open of the file is refused it)."""
    fd = os.open(lock_path(FakeGpu.uuid), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.fixture
def gpu_machine(tmp_path, monkeypatch):
    """A host of one GPU, the fake one, that NVML names: the session takes its lock before opening it."""
    monkeypatch.setenv("CONVSWEEP_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr("convsweep.device.provenance.gpu_uuids", lambda: [f"GPU-{FakeGpu.uuid}"])
    for name in ("CUDA_VISIBLE_DEVICES", LOCKED_ENV):
        monkeypatch.delenv(name, raising=False)


def test_a_session_holds_the_lock_around_the_context_and_lets_all_go_when_its_block_fails(gpu_machine):
    closed = []

    class ClosingGpu(FakeGpu):
        def __exit__(self, *exc):
            closed.append(("gpu", lock_held()))  # the context goes while the lock is still held

    class ClosingMonitor(SlowingMonitor):
        def __exit__(self, *exc):
            closed.append(("monitor", lock_held()))

    spec = job()
    batch = load_batch(load_network(resolve_network_path(spec.network)), spec.dataset, spec.batch, spec.input_format)
    phases: dict[str, float] = {}
    backend = dataclasses.replace(FAKE, gpu=ClosingGpu, monitor=ClosingMonitor)
    with pytest.raises(RuntimeError, match="a setting's bug"):
        with gpu_session(spec, batch, backend, "job j (t)", spec.streams, phases) as session:
            assert lock_held() and not closed
            assert len(session.streams) == 2 and session.chunks == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6),
                                                                     (6, 7), (7, 8)]
            assert session.arch == "sm_90" and session.buffers.x_host.shape[0] == 8
            assert session.rounds is None and session.peaks is None  # a job adds its own
            raise RuntimeError("a setting's bug")
    assert closed == [("monitor", True), ("gpu", True)] and not lock_held()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and LOCKED_ENV not in os.environ
    assert list(phases) == ["gpu_wait", "context", "allocate"]


def test_a_gpu_that_cannot_be_opened_is_the_machines_error_and_leaves_nothing_held(gpu_machine):
    def no_gpu_here():
        raise no_gpu("no driver here")

    spec = job(streams=1)
    batch = load_batch(load_network(resolve_network_path(spec.network)), spec.dataset, spec.batch, spec.input_format)
    with pytest.raises(MachineError, match="no NVIDIA GPU or driver on this machine"):
        with gpu_session(spec, batch, dataclasses.replace(FAKE, gpu=no_gpu_here), "winners of t at batch 8", 1):
            pytest.fail("a session without a GPU")
    assert not lock_held() and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_where_nvml_cannot_say_which_gpu_the_lock_of_the_one_opened_outlives_its_context(gpu_machine, monkeypatch):
    monkeypatch.setattr("convsweep.device.provenance.gpu_uuids", lambda: [])  # no NVML: no lock before the context
    closed = []

    class ClosingGpu(FakeGpu):
        def __exit__(self, *exc):
            closed.append(lock_held())

    spec = job(streams=1)
    batch = load_batch(load_network(resolve_network_path(spec.network)), spec.dataset, spec.batch, spec.input_format)
    with gpu_session(spec, batch, dataclasses.replace(FAKE, gpu=ClosingGpu), "job j (t)", 1):
        assert lock_held()  # taken once the context said which GPU it is
    assert closed == [True] and not lock_held()
