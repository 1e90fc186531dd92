"""What an experiment asked for and did not get, as its report says it: the jobs the sweep plans that have no
stored result, one row per variant and reason with their batches (and any other axis not at its usual value), and
why: this machine left them out, their last attempt stopped (its log's last `convsweep:` line), nothing says
(killed, never started: `snakemake` again runs them), or their result is written but not stored. Stored runs
of a job whose last attempt left no result (its kernel since edited, say) are from an earlier attempt: the
report leaves them out and says so here.

Read from the experiment's results folder, as the rules name its files (convsweep.app.plan): the sweep's record
of the run jobs it plans (Planned, `planned.json`), its record of the jobs this
machine left out (outcome.NotRun, `not-run.json`), and each job's spec, result and log. Without a plan record
the jobs left out are all it knows of; without either record there is nothing to say. The submissions of a class
folder that fail the check have no job at all: the sweep's record of them (sweep.classes.LeftOut,
`submissions-left-out.json`) gives each its row and its reason.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from convsweep.base import axes
from convsweep.sweep.config import variant_label
from convsweep.base.document import Bullets, Heading, Paragraph, Table
from convsweep.base.fileio import canonical_hash
from convsweep.analysis.outcome import NotRun, Planned, last_reason
from convsweep.sweep.classes import LEFT_OUT_FILE, LeftOut

PLANNED_FILE, NOT_RUN_FILE = "planned.json", "not-run.json"  # in results/<experiment>/, beside runs/, logs/, specs/
TITLE = "Asked for and not measured"
WHY_CHARS = 100  # a reason in a table cell; the log has all of it
MAX_VALUES = 8  # an axis's values in a table cell; past this, the first few, the last and how many
# Each way a job can lack a stored result, and what gets it one.
NOT_RUN, STOPPED, NO_RESULT, NOT_STORED = "not run", "did not finish", "no result stored", "result not stored"
NEXT_STEP = {NOT_RUN: "`snakemake` on a machine with an NVIDIA GPU runs {them}",
             STOPPED: "`snakemake` again runs {them}; {their} log, in logs/, says why it stopped",
             NO_RESULT: "`snakemake` again runs {them}",
             NOT_STORED: "`snakemake` again stores {them}; `convsweep ingest` on a result file says why it cannot"}
# outcome.NotRun's other kinds of job: (one, several)
OTHER_KINDS = {"profile": ("Nsight Compute profile", "Nsight Compute profiles"),
               "winners": ("confirmation of winners", "confirmations of winners")}


@dataclass(frozen=True)
class Missing:
    """A planned job without a stored result: its variant, its value of each axis, what happened and why."""

    job_id: str
    variant: str
    cell: dict[str, Any]
    what: str
    why: str


@dataclass
class Coverage:
    """An experiment's planned jobs against what is stored. `planned`: how many the plan record names (None
    without one); `superseded`: the jobs whose stored runs are from an earlier attempt."""

    planned: int | None
    missing: list[Missing] = field(default_factory=list)
    superseded: set[str] = field(default_factory=set)
    not_run_reason: str | None = None
    others_not_run: Counter = field(default_factory=Counter)  # profile / winners jobs left out, by kind
    submissions_left_out: LeftOut | None = None  # a class's submissions the sweep did not plan, with why


def read_coverage(folder: Path | None, stored: Iterable[str]) -> Coverage | None:
    """What the experiment whose results are in `folder` planned and has no stored result for, `stored` being the
    job ids of its stored runs; None where the folder holds neither record."""
    if folder is None:
        return None
    not_run = NotRun.read(folder / NOT_RUN_FILE)
    planned = Planned.read(folder / PLANNED_FILE)
    submissions = LeftOut.read(folder / LEFT_OUT_FILE)
    if not_run is None and planned is None and submissions is None:
        return None
    stored, left = set(stored), not_run.jobs if not_run else ()
    left_out = [job_id for kind, job_id in left if kind == "run"]
    left_set = set(left_out)
    coverage = Coverage(len(planned.jobs) if planned else None, not_run_reason=not_run.reason if not_run else None,
                        others_not_run=Counter(kind for kind, _ in left if kind != "run"),
                        submissions_left_out=submissions)
    for job_id in planned.jobs if planned else left_out:
        reason = cast(NotRun, not_run).reason if job_id in left_set else None  # left out: not_run says why
        said = _why_missing(folder, job_id, reason, job_id in stored)
        if said is None:
            continue
        if job_id in stored:  # and no result: what is stored of it is from before its last attempt
            coverage.superseded.add(job_id)
        coverage.missing.append(Missing(job_id, *_spec_of(folder / "specs" / f"{job_id}.json", job_id), *said))
    return coverage


def _why_missing(folder: Path, job_id: str, left_out: str | None, stored: bool) -> tuple[str, str] | None:
    """(what, why) of a planned job whose last attempt has no stored result; None where it has one. `left_out`:
    why this machine left it out, if it did."""
    if left_out is not None:  # stored runs of it were measured before, or elsewhere: they stand
        return None if stored else (NOT_RUN, left_out)
    if (folder / "runs" / f"{job_id}.json").exists():
        return None if stored else (NOT_STORED, "its result file is not in the database")
    # Snakemake removes a job's result before it runs the job again: a job without one stopped, or never started
    log = folder / "logs" / f"{job_id}.log"
    if reason := last_reason(log):
        return STOPPED, reason
    if log.exists():
        return STOPPED, f"stopped without a `convsweep:` line: see logs/{log.name}"
    return NO_RESULT, "nothing says why"


def _spec_of(path: Path, job_id: str) -> tuple[str, dict[str, Any]]:
    """(variant label, axis -> value) of a job from its spec file; the job id alone where it cannot be read."""
    try:
        spec = json.loads(path.read_text())
        return variant_label(spec["variants"]), axes.spec_values(spec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return job_id, {}


def section(coverage: Coverage | None, runs: Sequence[dict[str, Any]], failures_where: str) -> list:
    """The report's blocks for it (none where nothing is missing): how many jobs the sweep asks for and how many
    have no stored result, a table of those by variant and reason, what runs them, what else was not run, and
    where the settings that failed or were incorrect are told (`failures_where`). `runs`: those the report shows."""
    if coverage is None or not (coverage.missing or coverage.others_not_run or coverage.submissions_left_out):
        return []
    missing = coverage.missing
    blocks: list = [Heading(2, TITLE), *_submissions_left_out(coverage.submissions_left_out)]
    if missing:
        head = (f"The sweep asks for {_count(coverage.planned, 'job')} of this experiment; {len(missing)} of them "
                f"{'has' if len(missing) == 1 else 'have'} no stored result" if coverage.planned is not None else
                f"{_count(len(missing), 'job')} of this experiment {'has' if len(missing) == 1 else 'have'} no "
                "stored result")
        reasons = {(m.what, m.why) for m in missing}
        if len(reasons) == 1:  # said once, not on every row: the table is as wide as its longest reason
            what, why = reasons.pop()
            blocks += [Paragraph(f"{head}: {what}, {why}. {_sentence(_next_step(what, len(missing)))}."),
                       _table(missing, False)]
        else:
            counts = Counter(m.what for m in missing)
            steps = [f"**{what}**: {_next_step(what, counts[what])}." for what in NEXT_STEP if counts[what]]
            blocks += [Paragraph(f"{head}:"), _table(missing, True), Bullets(steps)]
    if coverage.others_not_run:
        others = " and ".join(_count(n, *OTHER_KINDS.get(kind, (kind, kind))) for kind, n in
                              sorted(coverage.others_not_run.items()))
        was = "was" if sum(coverage.others_not_run.values()) == 1 else "were"
        same = any(m.what == NOT_RUN for m in missing)
        blocks.append(Paragraph(f"Nor {was} its {others} run, for the same reason." if same
                                else f"Its {others} {was} not run: {coverage.not_run_reason}."))
    if coverage.superseded:
        variants = sorted({m.variant for m in missing if m.job_id in coverage.superseded})
        theirs = "its job" if len(coverage.superseded) == 1 else "their jobs"
        blocks.append(Paragraph(f"The runs stored for {_names(variants)} are from an earlier attempt of {theirs}, "
                                "whose last left no result: they are left out of this report's tables (`convsweep "
                                "query history` has every measurement)."))
    failed = sum(run["status"] in ("failed", "incorrect") for run in runs)
    if failed:
        blocks.append(Paragraph(f"Not listed here: {_count(failed, 'setting')} that ran and failed or gave wrong "
                                f"outputs, each {failures_where} with its error."))
    return blocks


def _submissions_left_out(left: LeftOut | None) -> list:
    """A paragraph and a table, a row per submission of the class folder that fails the check, with its reason."""
    if left is None:
        return []
    n = len(left.submissions)
    return [Paragraph(f"{_count(n, 'submission')} of the class folder `{left.folder}` {'was' if n == 1 else 'were'} "
                      f"not planned, beside the {left.planned} that {'was' if left.planned == 1 else 'were'}: "
                      f"{'it fails' if n == 1 else 'each fails'} the check and has no job (`convsweep submissions check "
                      f"{left.folder}` says the same; the next `snakemake` plans a submission fixed since)."),
            Table(["submission", "why"], [[sid, _cut(why)] for sid, why in left.submissions], [False, False])]


def _table(missing: list[Missing], with_why: bool) -> Table:
    """One row per variant (and reason, `with_why`), in plan order, with the values of each axis its jobs were
    asked at: batch always, any other axis where one of the jobs listed is not at the value a sweep gets unasked."""
    shown = [axis for axis in axes.AXES
             if (usual := _unasked(axis)) is None or {_value(m, axis) for m in missing} != usual]
    groups: dict[tuple, list[Missing]] = {}
    for m in missing:
        groups.setdefault((m.variant, m.what, m.why) if with_why else (m.variant,), []).append(m)
    rows = [[key[0], *(_values(jobs, axis) for axis in shown), str(len(jobs)), *([key[1], _cut(key[2])] if with_why
                                                                                 else [])]
            for key, jobs in groups.items()]
    headers = ["variant", *(axis.heading for axis in shown), "jobs", *(["what", "why"] if with_why else [])]
    numeric = [False, *(axis.numeric for axis in shown), True, *([False, False] if with_why else [])]
    return Table(headers, rows, numeric)


def _values(jobs: list[Missing], axis: axes.Axis) -> str:
    """The jobs' distinct values of an axis, as the report says them: '100, 1000 and 10000' (numbers ascending,
    an automatic value first; other values as the plan lists them: fp32 before fp16)."""
    values = list(dict.fromkeys(_value(m, axis) for m in jobs))
    if axis.numeric:
        values.sort(key=lambda v: (v is not None, v or 0))
    texts = [str(v) if v is not None else "?" if axis.required else "auto" for v in values]
    if len(texts) > MAX_VALUES:  # a cell stays a cell
        return f"{', '.join(texts[:MAX_VALUES - 2])}, … and {texts[-1]} ({len(texts)} values)"
    return ", ".join(texts[:-1]) + f" and {texts[-1]}" if len(texts) > 1 else texts[0]


def _unasked(axis: axes.Axis) -> set | None:
    """The value a job has where its sweep does not name the axis (the spec's default, else experiments.yaml's),
    as a set; None for an axis every sweep names (batch)."""
    if not axis.required:
        return {axis.default}
    return {axis.from_config(value) for value in axis.config_default} if axis.config_default else None


def _value(missing: Missing, axis: axes.Axis) -> Any:
    """The job's value of an axis; None for a required one its spec did not say."""
    return missing.cell.get(axis.name, None if axis.required else axis.default)


def _next_step(what: str, jobs: int) -> str:
    return NEXT_STEP[what].format(them="it" if jobs == 1 else "them", their="its" if jobs == 1 else "each one's")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= WHY_CHARS else text[:WHY_CHARS - 1].rstrip() + "…"


def _names(variants: list[str]) -> str:
    names = [f"`{v}`" for v in variants]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def left_out_key(plan, experiment: str) -> str:
    """What the plan (convsweep.app.plan.SweepPlan) leaves out of the experiment on this machine and why, as a short
    key: make_report's parameter, so that a change to it makes the report again, as a new result does (the jobs
    left out have no result to be newer)."""
    if not plan.left_out:
        return "none"
    left = [job.job_id for job in plan.jobs
            if job.experiment == experiment and not plan.runs_here(experiment, job.job_id)]
    return canonical_hash([plan.left_out, left, plan.config.experiments[experiment].get("ncu"),
                           plan.winner_groups(experiment)])[:16]
