"""A course's class as a sweep knows it (`submissions: DIR` in experiments.yaml; docs/course.md). Each submission
of the folder is read as `convsweep submissions check` reads it (convsweep.sweep.submissions), but for NVRTC and the
expressions over its whole grid (the plan meets a variant's constraints at the settings it measures, its jobs its
launches); its variants go by their class-wide names, their sources in the checked copy NVRTC builds (build_folder),
and are looked up one submission at a time (ClassLookup), so that a job, given its spec alone, reads and copies its
own submission only. The submissions that fail are left out of the sweep, each with its one line why (LeftOut, the
record the end of a sweep and its report read)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from convsweep.base.errors import ConfigError, ConvsweepError
from convsweep.base.paths import ROOT, cache_dir
from convsweep.model.variants import Variant, join_class as join_lookup
from .submissions import (REGISTRY_NAME, SEPARATOR, Found, build_folder, class_prefix, find_submissions, one_line,
                          read_submission)

LEFT_OUT_FILE = "submissions-left-out.json"  # in results/<experiment>/, beside planned.json and not-run.json
LEFT_OUT_FORMAT = "submissions-left-out-1"


def class_folder(value: str) -> Path:
    """The folder a sweep's `submissions:` (or a job's spec) names: absolute as given, else in the checkout."""
    return Path(value) if Path(value).is_absolute() else ROOT / value


def spec_folder(value: str) -> str:
    """The class folder as a job's spec names it: relative to the checkout where it lies inside (two clones of it
    agree), else absolute."""
    path = Path(os.path.abspath(class_folder(value)))
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


class ClassLookup:
    """The submissions of one class folder (`shown` as the sweep or spec names it): each read, checked and copied when
    one of its variants is first asked for, and again once one of its files has changed."""

    def __init__(self, shown: str):
        self.folder, self.shown, self.key = class_folder(shown), shown, spec_folder(shown)  # key: as a spec has it
        self._found: tuple[int, list[Found]] | None = None  # the folder's modification time, its submissions
        self._by_prefix: dict[str, Found] = {}  # each by its class prefix, as a class-wide name begins
        self._read: dict[Path, tuple[tuple, dict[str, Variant]]] = {}  # a submission's files' version, its variants

    def found(self) -> list[Found]:
        """The folder's submissions (find_submissions), listed again once the folder's entries change."""
        try:
            listed = self.folder.stat().st_mtime_ns
        except OSError as e:
            why = f"{self.shown}: expected a folder of submissions (docs/course.md): {e.strerror}"
            raise ConfigError(why) from None
        if self._found is None or self._found[0] != listed:
            self._found = (listed, find_submissions(self.folder))
            self._by_prefix = {class_prefix(item.id): item for item in self._found[1]}
        return self._found[1]

    def shown_of(self, item: Found) -> str:
        """A submission's folder as the sweep names it (the class folder itself, where that is one submission)."""
        return self.shown if item.path == self.folder else f"{self.shown}/{item.id}"

    def variants(self, item: Found) -> dict[str, Variant]:
        """A submission's variants by class-wide name, their sources in its checked copy; why it cannot be used is
        one ConfigError line (the check's first reason)."""
        shown = self.shown_of(item)
        if item.refusal is not None:
            raise ConfigError(item.refusal.replace(str(self.folder), self.shown, 1))
        version = _version(item.path)
        if (known := self._read.get(item.path)) is None or known[0] != version:
            submission = read_submission(item.path, item.id, shown, None)
            built = build_folder(submission, cache_dir() / "submissions")
            known = self._read[item.path] = (version, {
                full: dataclasses.replace(var, source=built / Path(str(var.source)).name)
                for full, var in submission.class_variants().items()})
        return known[1]

    def __call__(self, name: str) -> Variant | None:
        """The variant of a class-wide name (a resolver of convsweep.model.variants.join_class)."""
        prefix, separator, _ = name.partition(SEPARATOR)
        if not separator:
            return None
        try:
            self.found()
        except ConfigError:  # the folder is gone: it names nothing now (and a look-up elsewhere is not its business)
            return None
        if (item := self._by_prefix.get(prefix)) is None:
            return None
        try:
            return self.variants(item).get(name)
        except (ConvsweepError, OSError) as e:
            raise ConfigError(f"variant '{name}': submission {item.id} cannot be used: {reason_of(e)}") from None


def join_class(value: str) -> ClassLookup:
    """The class a sweep or a job's spec names, joined to this process's variant look-ups (get_variant), once."""
    lookup = ClassLookup(value)
    return cast(ClassLookup, join_lookup(lookup.key, lookup))


def reason_of(e: Exception) -> str:
    """Why a submission cannot be used, from what reading it raised, as one line (a bug's with its type)."""
    if isinstance(e, OSError):
        return one_line(f"{e.filename}: {e.strerror or e}" if e.filename else str(e))
    return one_line(str(e) if isinstance(e, ConvsweepError) else f"{type(e).__name__}: {e}")


def _version(folder: Path) -> tuple:
    """Each file and folder under `folder` with its size and modification time: changes when one of them does."""
    found = []
    for base, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            info = os.stat(os.path.join(base, name), follow_symlinks=False)
            found.append((os.path.join(base, name), info.st_size, info.st_mtime_ns))
    return tuple(found)


def plan_class(lookup: ClassLookup, jobs_of: Callable[[str, Variant, str], list], where: str
               ) -> tuple[list, LeftOut | None]:
    """The jobs of every variant of every submission of the class, in the order of their ids (`jobs_of(class-wide
    name, variant, where)`: one variant's, raising a ConvsweepError where the sweep cannot run it), and the
    submissions left out: those the check refuses, and those with a variant the sweep cannot run (none of its jobs
    is planned). None where every one is planned. A folder that is none, or holds no submission, is one ConfigError
    line beginning with `where` (the sweep's key)."""
    try:
        found = lookup.found()
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if not found:
        raise ConfigError(f"{where}: {lookup.shown} holds no submission folder (docs/course.md)")
    jobs, refused = [], {}
    for item in found:
        try:
            mine = [job for full, var in lookup.variants(item).items() for job in
                    jobs_of(full, var, f"{lookup.shown_of(item)}/{REGISTRY_NAME}: {full.partition(SEPARATOR)[2]}")]
        except Exception as e:  # a bad submission never stops the others (nor does a bug it finds: told too)
            refused[item.id] = reason_of(e)
            continue
        jobs += mine
    return jobs, LeftOut(lookup.shown, tuple(sorted(refused.items())), len(found) - len(refused)) if refused else None


@dataclass(frozen=True)
class LeftOut:
    """The submissions of an experiment's class folder that its sweep did not plan, each with its one line why
    (`results/<experiment>/submissions-left-out.json`, written before any job runs; no file: every one was planned):
    the start and the end of the sweep say so, and the report."""

    folder: str  # as the sweep names it
    submissions: tuple[tuple[str, str], ...]  # (id, reason)
    planned: int  # the submissions planned beside them

    @classmethod
    def read(cls, path: Path) -> LeftOut | None:
        """The record at `path`; None where there is none. One that cannot be read, or is of another format, raises
        ConvsweepError naming the file."""
        try:
            data = json.loads(Path(path).read_text())
            if data["format"] != LEFT_OUT_FORMAT:
                raise ValueError(f"format {data['format']!r}")
            return cls(str(data["folder"]), tuple((str(s["id"]), str(s["reason"])) for s in data["submissions"]),
                       int(data["planned"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConvsweepError(f"{path}: expected a {LEFT_OUT_FORMAT} record of the submissions a sweep left out "
                                 f"({e})") from None

    def lines(self, experiment: str) -> list[str]:
        """What a sweep says of them: a line for the count, then one per submission with its reason."""
        n = len(self.submissions)
        return [f"convsweep: {experiment}: {n} submission{'s' * (n != 1)} of {self.folder} left out, not planned "
                f"({self.planned} planned): {'it fails' if n == 1 else 'each fails'} the check "
                f"(`convsweep submissions check {self.folder}` says the same)",
                *(f"  {sid}: {why}" for sid, why in self.submissions)]


class LeftOuts(dict[str, LeftOut]):
    """By experiment, the submissions of its class folder a sweep left out (none: every one planned)."""

    def tell(self, experiments: list[str]) -> None:
        """Say, on stderr, which submissions the `experiments` left out and why: a line each, after a line for each
        experiment's count."""
        if lines := [line for e in experiments if e in self for line in self[e].lines(e)]:
            print("\n".join(lines), file=sys.stderr, flush=True)

    def write(self, folder: Path, experiment: str) -> None:
        """The experiment's record in its results `folder` (LEFT_OUT_FILE), written where it left submissions out,
        else removed."""
        from convsweep.base.fileio import write_json_atomic

        if (left := self.get(experiment)) is None:
            return (folder / LEFT_OUT_FILE).unlink(missing_ok=True)
        write_json_atomic(folder / LEFT_OUT_FILE, {
            "format": LEFT_OUT_FORMAT, "folder": left.folder, "planned": left.planned,
            "submissions": [{"id": sid, "reason": why} for sid, why in left.submissions]})
