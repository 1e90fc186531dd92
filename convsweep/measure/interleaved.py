"""Confirmation's timing: settings of one cell measured in one process, one pass of each in turn, on rounds no
kernel has seen (`measure_interleaved`, for convsweep.measure.confirm)."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from convsweep.base.errors import ConvsweepError, failure_message
from convsweep.base.paths import resolve_network_path
from convsweep.base.progress import progress
from convsweep.inputs.batch import load_batch
from convsweep.model.network import load_network
from convsweep.model.variants import get_variant
from convsweep.sweep.config import JobSpec, RunSpec
from .context import timed_variants
from convsweep.device.rounds import FRESH_SHARE
from .integrity import MAX_STALE_ROUNDS, WORKSPACE_POISON, open_rounds, workspaces
from .runner import Backend, ConvPlan, pipeline_pass, poison_logits
from .settings import _build_arch, build_requests, gpu_session
from .timing import HealthObserver, HostClock, Observer, Reading, pipeline_timer, sample
from convsweep.base.stats import StoppingRule


@dataclass
class Interleaved:
    """Settings re-measured in alternation (`measure_interleaved`): each one's op time per conv layer and round
    (None where the setting failed), its status and error, the GPU's clocks around the rounds, and what made
    the rounds (`inputs`: the seed) and how new they were (`freshness`)."""

    op_time_ms: list[dict[str, list[float]]]
    status: list[str]
    error: list[str | None]
    environment: dict | None = None
    clocks: dict | None = None
    clocks_after: dict | None = None
    inputs: dict | None = None
    freshness: dict | None = None


class Turns(Observer):
    """The rounds of `measure_interleaved` as `sample` sees them: before each, a round no kernel has seen, made on
    the device; after it (every setting's pass done, its logits kept in `kept`), the round's truth and each setting
    held to it (a wrong one is `incorrect` in `result` and leaves `nets`), and a round not visibly new not counted
    (past MAX_STALE_ROUNDS of them, an error). A counted round's times (`times`, setting -> layer -> ms, which the
    round fills) go to `result`."""

    def __init__(self, made, nets: dict, layers: list, kept: dict, result: Interleaved, bar):
        self.made, self.nets, self.layers, self.kept, self.result, self.bar = made, nets, layers, kept, result, bar
        self.times: dict[int, dict[str, float]] = {}
        self.freshness: dict[str, Any] = {"counted": 0, "stale_rounds": 0, "share": None}

    def before_pass(self, i: int) -> None:
        self.made.fresh(ship=False)
        self.times = {}

    def after_pass(self, i: int, reading: Reading) -> bool:
        made, freshness, result = self.made, self.freshness, self.result
        # Every setting has run on the round: only now is its truth worked out, and each setting held to it.
        share = made.sight()
        freshness["share"] = share if freshness["share"] is None else min(freshness["share"], share)
        for k in list(self.nets):
            check = made.judge(self.layers[k].values(), self.kept[k])
            if check.status != "ok":
                result.status[k], result.error[k] = "incorrect", f"round {made.current.round}: {check.error}"
                del self.nets[k]
        if share < FRESH_SHARE:  # not a round no kernel has seen: its times do not count
            freshness["stale_rounds"] += 1
            if freshness["stale_rounds"] > MAX_STALE_ROUNDS:
                raise ConvsweepError(f"{freshness['stale_rounds']} rounds were not visibly new: the perturbation "
                                     "(convsweep.device.rounds) is too weak for this network")
            return False
        freshness["counted"] += 1
        for k in self.nets:
            for name, ms in self.times[k].items():
                result.op_time_ms[k][name].append(ms)
        self.bar.update(1)
        return True


def measure_interleaved(spec: JobSpec, runs: Sequence[RunSpec], rounds: int, backend: Backend = Backend()
                        ) -> Interleaved:
    """Settings of one cell (`spec`'s batch, input and axes; each its own variants and tunables: `runs`)
    measured in one process on one stream, round after round, one pass of each in turn: A B C A B C ...
    Each network is built and its first pass, host to host on round 0, checked against the float64 truth before
    the rounds (a wrong one takes no part). Each round is a round no kernel has seen (convsweep.device.rounds), made on
    the device and copied to the batch's buffer before each setting's pass; the stream is held until the pass is
    enqueued, and each conv layer is timed between CUDA events, L2 written over before each under a cold cache.
    After every setting's pass of a round, the round's truth is worked out and each setting's logits are compared
    with it: a wrong one is `incorrect` and leaves the rounds; a round that is not visibly new does not count.
    The rounds are `sample`'s passes (convsweep.measure.timing), as a job's are, with its observers: `Turns`, then
    the GPU's health (the clocks around the rounds). A GPU that cannot be opened raises MachineError."""
    network = load_network(resolve_network_path(spec.network))
    layers = [timed_variants(network, {layer: get_variant(name) for layer, name in run.variants.items()})
              for run in runs]
    batch = load_batch(network, spec.dataset, spec.batch, spec.input_format)
    result = Interleaved([{name: [] for name in variants} for variants in layers], ["ok"] * len(runs),
                         [None] * len(runs))
    arch = _build_arch(spec)
    requests = [r for run, variants in zip(runs, layers) for r in build_requests(batch.network, variants, run)]
    holder = f"winners of {spec.experiment} at batch {spec.batch}"
    with ExitStack() as stack:
        stack.enter_context(backend.compile_all(requests, arch)).wait()
        session = stack.enter_context(gpu_session(spec, batch, backend, holder, streams=1))
        gpu, buffers, chunks, (stream,) = session.gpu, session.buffers, session.chunks, session.streams
        result.environment = session.environment
        made = open_rounds(gpu, session.arch, batch, buffers, spec.host_memory, stream)
        result.inputs = made.maker.record()
        flush = gpu.l2_flusher() if spec.cache == "cold" else None
        timer = pipeline_timer(gpu, stream, graph=False)
        flag = gpu.host_array((1,), np.int32, "pinned")

        def checked_pass(net):  # host to host on round 0, as a job's seed pass: its logits are checked
            def run(marks: dict):
                start, _, _, end = pipeline_pass(gpu, net, [stream], chunks, buffers, marks, flush)
                return start, end
            return run

        def held_pass(net):
            # The batch already on the device, the stream held until the whole pass is enqueued: a layer's events
            # then bound its kernels alone. (Without the hold, on the lent H100 a batch-100 conv layer whose kernel
            # nsys timed at 5 us measured 47 us between events: the host's launches, not the kernel.)
            def run(marks: dict):
                net.hold(stream, flag)
                start = gpu.event(stream)
                for lo, hi in chunks:
                    net.enqueue(stream, net.lanes[0], buffers.x_dev.rows(lo, hi), buffers.logits_dev.rows(lo, hi),
                                hi - lo, marks, flush)
                end = gpu.event(stream)
                flag[0] = 1
                return start, end
            return run

        nets = {}
        made.use_round0()
        for i, (run, variants) in enumerate(zip(runs, layers)):
            try:
                plan = ConvPlan(variants, {layer: var.resolve_params(run.params.get(layer), f"params.{layer}")
                                           for layer, var in variants.items()}, session.arch)
                net = backend.network(gpu, batch.network, batch.weights, plan, 1, max(hi - lo for lo, hi in chunks))
                poison_logits(gpu, buffers, stream)
                timer.warm(checked_pass(net))
                check = made.judge(variants.values())
                result.status[i], result.error[i] = check.status, check.error
                if check.status == "ok":
                    nets[i] = net
            except Exception as e:  # this setting's failure (a build, a launch): the others go on
                result.status[i], result.error[i] = "failed", failure_message(e)
        kept = {i: gpu.alloc(buffers.logits_dev.shape, buffers.logits_dev.dtype) for i in nets}
        made.new_scope()
        bar = progress(total=rounds, desc=f"winners at batch {spec.batch}", unit="round", enabled=rounds > 1)
        turns = Turns(made, nets, layers, kept, result, bar)

        def one_round(marks: dict) -> None:  # each setting's pass on the round, in turn; its times to `turns`
            for i, net in turns.nets.items():
                gpu.copy(buffers.x_dev, made.current.made, stream)  # exactly what was made, for each in turn
                gpu.fill(buffers.logits_dev, 0xFF, stream)
                for workspace in workspaces(net):
                    gpu.fill(workspace, WORKSPACE_POISON, stream)
                reading = timer.time(held_pass(net))
                _ = reading.ms  # waits for the pass
                gpu.copy(kept[i], buffers.logits_dev, stream)
                turns.times[i] = {name: reading.marked_ms(name) for name in result.op_time_ms[i]}

        # One `sample` pass is a round: the host clock around it (its own time is no one's); the turns judge it
        # first (a round not visibly new is not counted, and another is made), then the GPU's health.
        health = HealthObserver(session.monitor)
        sample(HostClock(), one_round, StoppingRule(repeats=rounds), [turns, health])
        bar.close()
        result.clocks, result.clocks_after = health.clocks, health.clocks_after
        result.freshness = turns.freshness
    return result
