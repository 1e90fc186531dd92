"""Winners confirmed: once the jobs of a cell have measured their settings (the jobs of an experiment that
differ only in variant and tunables), the `top` fastest settings of each conv layer are measured again in
one process, interleaved, A B C A B C ... (a drift of the clocks moves them all alike), every round on
inputs no kernel has seen and every pass checked against the float64 truth (convsweep.measure.interleaved), and each layer's winner is named with the settings it cannot be told apart from
(convsweep.base.stats.paired_difference).

A confirm job reads its cell's result files and writes one file (convsweep.measure.files.ConfirmFile, format
`confirm-1`, workflow/schemas/confirm.schema.yaml); ingest stores its verdicts as `confirmation` rows, which
`query best` and the report read. The first ranking is the result files' own; where the re-measurement
puts its winner behind another, the file says the ranking was overturned.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from convsweep.sweep.config import JobSpec, RunSpec, variant_label
from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import canonical_hash
from convsweep.base.numbers import median
from .files import CONFIRM_FORMAT, ConfirmCandidate, ConfirmFile, LayerVerdict, VerdictEntry
from .record import Measurement, ResultFile, utc_now
from convsweep.base.stats import Paired, paired_difference, relative_spread


@dataclass(frozen=True)
class ConfirmSpec:
    """One confirm job: its experiment and cell (`job`: the spec of one of the cell's jobs, whose batch,
    input and axes every setting shares), the cell's result files, and how many settings per layer
    (`top`) are re-measured over how many `rounds`."""

    experiment: str
    group_id: str
    job: dict[str, Any]
    results: list[str]
    top: int
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConfirmSpec:
        try:
            return cls(**data)
        except TypeError as e:
            raise ConvsweepError(f"--spec: not a confirm spec ({e})") from None


@dataclass(frozen=True)
class Candidate:
    """A setting to re-measure: its stored measurement, its spec, and for each layer it is among the
    fastest of, its place (1 first) and op time in the first ranking."""

    measurement_id: str
    job_id: str
    run: RunSpec
    first: dict[str, tuple[int, float]]


def _op_ms(m: Measurement) -> dict[str, float | None]:
    """A measurement's op time per conv layer: every one `choose` ranks has them."""
    assert m.timings is not None and m.timings.op_time_ms is not None
    return m.timings.op_time_ms


def choose(results: list[ResultFile], top: int) -> list[Candidate]:
    """The `top` fastest correct settings of each conv layer among the results, by their median op time (the
    earlier measured first on a tie), in the order the layers and places name them. A layer's setting is its
    variant and its own tunables: of the settings that share them (a grid that tunes each layer on its own
    measures one conv2 kernel beside many conv1 kernels) only the fastest measurement takes part."""
    ok = [m for result in results for m in result.measurements
          if m.status == "ok" and m.timings is not None and m.timings.op_time_ms]
    layers = list(dict.fromkeys(layer for m in ok for layer, ms in _op_ms(m).items() if ms is not None))
    firsts: dict[str, dict[str, tuple[int, float]]] = {}
    for layer in layers:
        timed = sorted((m for m in ok if _op_ms(m).get(layer) is not None), key=lambda m: cast(float, _op_ms(m)[layer]))
        distinct: dict[str, Measurement] = {}
        for m in timed:
            distinct.setdefault(canonical_hash([m.spec["variants"][layer], (m.params or {}).get(layer)]), m)
        for place, m in enumerate(list(distinct.values())[:top], start=1):
            firsts.setdefault(m.measurement_id, {})[layer] = (place, cast(float, _op_ms(m)[layer]))
    by_id = {m.measurement_id: m for m in ok}
    return [Candidate(mid, by_id[mid].job_id, RunSpec(**by_id[mid].spec), first) for mid, first in firsts.items()]


def judge(candidates: list[Candidate], op_time_ms: list[dict[str, list[float]]], status: list[str],
          error: list[str | None]) -> list[LayerVerdict]:
    """Each layer's verdict: its candidates in the confirmed order, the fastest median first (`winner`),
    then those a paired test cannot tell from it (`tied`), the rest `slower`, and those whose confirming
    pass was wrong or failed last; `overturned` where the first ranking's winner is neither winner nor tied."""
    verdicts = []
    layers = list(dict.fromkeys(layer for c in candidates for layer in c.first))
    for layer in layers:
        members = [i for i, c in enumerate(candidates) if layer in c.first]
        measured = sorted((i for i in members if status[i] == "ok" and op_time_ms[i].get(layer)),
                          key=lambda i: cast(float, median(op_time_ms[i][layer])))  # each has times
        entries = []
        winner = measured[0] if measured else None
        for place, i in enumerate(measured, start=1):
            samples = op_time_ms[i][layer]
            assert winner is not None  # measured[0]
            paired = paired_difference(op_time_ms[winner][layer], samples) if i != winner else None
            standing = "winner" if i == winner else ("tied" if cast(Paired, paired).tied else "slower")
            entries.append(_entry(candidates[i], layer, place, standing, samples, paired))
        if len(entries) > 1:  # the winner's: the smallest difference from the runner-up these rounds would find
            entries[0].detectable_ms = entries[1].detectable_ms
        for i in members:
            if i not in measured:
                entry = _entry(candidates[i], layer, None, status[i] if status[i] != "ok" else "failed", [], None)
                entry.error = error[i] or "no op time measured"
                entries.append(entry)
        first = next(e for e in entries if e.first_place == 1) if entries else None
        verdicts.append(LayerVerdict(layer, list(candidates[members[0]].run.variants).index(layer),
                                     first is not None and first.standing not in ("winner", "tied"), entries))
    return verdicts


def _entry(candidate: Candidate, layer: str, place: int | None, standing: str, samples: list[float],
           paired: Paired | None) -> VerdictEntry:
    return VerdictEntry(measurement_id=candidate.measurement_id, first_place=candidate.first[layer][0],
                        first_ms=candidate.first[layer][1], place=place, standing=standing,
                        median_ms=median(samples) if samples else None,
                        spread=relative_spread(samples) if samples else None,
                        difference_ms=paired.difference_ms if paired else None,
                        p_value=paired.p_value if paired else None,
                        detectable_ms=paired.detectable_ms if paired else None, samples_ms=samples)


def _skipped(spec: ConfirmSpec, started_at: str) -> ConfirmFile:
    return ConfirmFile(format=CONFIRM_FORMAT, confirmation_id=uuid.uuid4().hex, experiment=spec.experiment,
                       group_id=spec.group_id, batch=JobSpec.from_dict(spec.job).batch, top=spec.top,
                       rounds=spec.rounds, started_at=started_at, status="skipped", candidates=[], layers=[])


def write_skipped(spec: ConfirmSpec, out_path: Path, reason: str, started: float, started_at: str) -> dict[str, Any]:
    """A confirm file that confirms nothing, saying why (a round that ran past the deadline: run_confirm_job's
    process killed by its watcher, convsweep.measure.deadline); returns its JSON."""
    confirmation = _skipped(spec, started_at)
    confirmation.reason, confirmation.total_s = reason, time.perf_counter() - started
    confirmation.write(out_path)
    return confirmation.to_json()


def run_confirm_job(spec: ConfirmSpec, out_path: Path, backend=None) -> dict[str, Any]:
    """Re-measure the cell's fastest settings and write the confirm file (a ConfirmFile); returns its JSON. A cell
    with fewer than two settings to tell apart writes a `skipped` file saying so. A machine that cannot run it
    raises MachineError, with no file at `out_path`."""
    from .job import no_result_on_machine_error
    from convsweep.base.strict_json import read_json

    started, started_at = time.perf_counter(), utc_now()
    out_path = Path(out_path)
    results = [ResultFile.from_json(read_json(path)) for path in spec.results if Path(path).exists()]
    candidates = choose(results, spec.top)
    cell = JobSpec.from_dict(spec.job)
    confirmation = _skipped(spec, started_at)
    if len(candidates) < 2:
        confirmation.reason = f"{len(candidates)} correct setting(s) with op times: nothing to tell apart"
    else:
        from .interleaved import measure_interleaved
        from .runner import Backend

        with no_result_on_machine_error(out_path):
            measured = measure_interleaved(cell, [c.run for c in candidates], spec.rounds, backend or Backend())
        confirmation.status, confirmation.environment = "ok", measured.environment
        confirmation.clocks, confirmation.clocks_after = measured.clocks, measured.clocks_after
        confirmation.inputs, confirmation.freshness = measured.inputs, measured.freshness
        confirmation.candidates = [ConfirmCandidate(measurement_id=c.measurement_id, job_id=c.job_id,
                                                    run_key=c.run.run_key, variant=variant_label(c.run.variants),
                                                    variants=c.run.variants, params=c.run.params,
                                                    status=measured.status[i], error=measured.error[i])
                                   for i, c in enumerate(candidates)]
        confirmation.layers = judge(candidates, measured.op_time_ms, measured.status, measured.error)
    confirmation.total_s = time.perf_counter() - started
    with no_result_on_machine_error(out_path):
        confirmation.write(out_path)
    return confirmation.to_json()


def summary_lines(written: dict[str, Any]) -> list[str]:
    """What a confirm job prints, from the file it wrote: a line per layer, its winner, ties and whether the
    ranking held."""
    confirmation = ConfirmFile.from_json(written)
    if confirmation.status != "ok":
        return [f"{confirmation.group_id}: not confirmed: {confirmation.reason}"]
    candidates = {c.measurement_id: c for c in confirmation.candidates}

    def named(entry: VerdictEntry, layer: str) -> str:  # 'fp16_sliding_window WARPS=4,PR=2': the layer's setting
        candidate = candidates[entry.measurement_id]
        values = (candidate.params or {}).get(layer) or {}
        return " ".join([(candidate.variants or {})[layer], ",".join(f"{k}={v}" for k, v in values.items())]).strip()

    lines = []
    for verdict in confirmation.layers:
        winner = next((e for e in verdict.entries if e.standing == "winner"), None)
        at = f"{verdict.layer} at batch {confirmation.batch}"
        if winner is None:
            lines.append(f"{at}: no candidate measured")
            continue
        tied = sum(e.standing == "tied" for e in verdict.entries)
        lines.append(f"{at}: {named(winner, verdict.layer)} {winner.median_ms:.4f} ms"
                     + (f", tied with {tied}" if tied else "")
                     + (" (first ranking overturned)" if verdict.overturned else " (first ranking held)"))
    return lines
