"""The Snakefile's view of a sweep: which files each rule makes, what it depends on, and the
command line that runs this checkout's convsweep.

Snakemake needs names and paths; convsweep's config module knows the jobs. This keeps the
translation in one place so the rule files hold wiring only.
"""
from __future__ import annotations

import gc
import json
import os
import secrets
import shlex
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import closing
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, cast

from convsweep.device.compile import LAYERS_SOURCE, kernel_sources
from convsweep.sweep.config import Config, JobSpec, expand, validate
from convsweep.base.errors import ConvsweepError
from convsweep.analysis.outcome import GPU_JOBS_ENV
from convsweep.base.paths import ROOT, check_same_checkout, resolve_network_path
from convsweep.model.variants import get_variant

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from convsweep.device.provenance import Machine

CPU_SWEEP = ROOT / "sweeps" / "cpu.yaml"  # the sweep a machine without a GPU runs whole


def release_scheduler_timer() -> None:
    """Cancel the re-scheduling timer Snakemake 9 leaves behind. Its job-rate limiter re-arms a
    one-second, non-daemon `threading.Timer` on each scheduling pass, and the last one holds a finished
    `snakemake` for up to a second after its last job. Called from onsuccess/onerror: scheduling is over."""
    for thread in threading.enumerate():
        function = getattr(thread, "function", None)
        if isinstance(thread, threading.Timer) and "_schedule_reevalutation" in getattr(function, "__qualname__", ""):
            thread.cancel()


def skip_final_collection() -> None:
    """Move every object Snakemake has made into the garbage collector's permanent generation, so
    that the interpreter's last collection at exit skips them: it walked them for ~0.35 s after a
    sweep had finished. Called from onsuccess/onerror: the run is over."""
    gc.freeze()


def store_identity(url: str) -> str | None:
    """Which store `url` names, read without creating or writing anything: an SQLite file's stamp (see
    stamp_store), a PostgreSQL database's oid (a database dropped and created again has another). None
    for a store that is missing, unstamped or cannot be read: check_store then creates and stamps it,
    or says in one line why it cannot."""
    from convsweep.store.engine import make_engine, resolve_url, sqlite_path

    try:
        sa_url = resolve_url(url)
    except ConvsweepError:
        return None
    if sa_url.get_backend_name() == "sqlite":
        path = sqlite_path(sa_url)
        if path is None or not path.is_file():
            return None
        try:  # read-only, and read through SQLite: a stamp just written may still be in the -wal file
            with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)) as db:
                stamp = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error:
            return None
        return f"stamp {stamp:08x}" if stamp else None
    if sa_url.get_backend_name() != "postgresql":
        return None
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        engine = make_engine(sa_url, read_only=True)
        try:
            with engine.connect() as connection:
                oid = connection.scalar(text("SELECT oid FROM pg_database WHERE datname = current_database()"))
        finally:
            engine.dispose()
    except (ConvsweepError, SQLAlchemyError):
        return None
    return f"postgresql oid {oid}"


def stamp_store(engine: Engine, stamp: int) -> None:
    """Give an SQLite store that has none its stamp, in the header field SQLite leaves to applications
    (PRAGMA user_version): which creation of the file this is, which a new file at the same path does not
    share. A stamped store keeps its own; a PostgreSQL database needs none (its oid tells)."""
    if engine.dialect.name != "sqlite":
        return
    # IMMEDIATE, as the store's writers take it (convsweep.store.engine): two sweeps starting at once stamp it once.
    with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as connection:
        if not connection.exec_driver_sql("PRAGMA user_version").scalar():
            connection.exec_driver_sql(f"PRAGMA user_version = {int(stamp)}")


def _shown(path: Path) -> str:
    """A file as a rule names it: relative to the working directory when inside it (a sweep run from
    its checkout prints `kernels/naive.cu`, not the whole path), else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class SweepPlan:
    def __init__(self, config: dict, config_path: str | Path = "experiments.yaml", checkout: str | Path | None = None,
                 workflow=None, probe=None):
        if checkout is not None:  # the Snakefile's own directory: plan with its convsweep, or not at all
            check_same_checkout(checkout)
        # Snakemake's workflow, for the Snakefile's plan: where its jobs run; and what asks what the machine has
        # (provenance.probe_machine, or a test's stand-in): see left_out.
        self._workflow, self._probe = workflow, probe
        self.config = Config(Path(config_path), validate(config, str(config_path)))
        self.jobs, self.submissions_left_out = expand(self.config)  # now: a bad variant stops Snakemake in one line
        self._networks: dict[str, object] = {}
        self.bench: str | None = self._bench_file()  # checked now, with the rest of the config
        self._planned_at = time.time()
        self._new_stamp: int | None = None  # store_id's, for a store that has none yet: check_store writes it

    @classmethod
    def for_snakefile(cls, config: dict, configfiles: list, checkout: str | Path, workflow=None) -> SweepPlan:
        """The plan the Snakefile runs. A config or checkout it cannot use stops Snakemake with one line:
        SystemExit, whose message Snakemake prints alone, where an exception would also get the lines of
        the Snakefile and convsweep it came through."""
        try:
            return cls(config, configfiles[-1] if configfiles else "experiments.yaml", checkout=checkout,
                       workflow=workflow)
        except ConvsweepError as e:
            raise SystemExit(f"convsweep: {e}") from None

    @staticmethod
    def check_configfile(path: str | Path) -> None:
        """Read the default config file with convsweep's bounded loader before Snakemake's own reads it:
        Snakemake's update_config walks every repetition of a YAML alias, so a bomb of mappings would
        stall it before the plan ever saw the config. A missing or empty file, or one that is not a
        mapping, is convsweep's one line too, where Snakemake would name its own directive."""
        from convsweep.base.yamlio import read_yaml_file

        path = Path(path)
        if not path.is_file():
            raise SystemExit(f"convsweep: {path}: no such file in {Path.cwd()}: `snakemake` runs the {path} of "
                             f"the directory it runs in, or the sweep `--configfile FILE` names")
        try:
            data = read_yaml_file(path)
        except ConvsweepError as e:
            raise SystemExit(f"convsweep: {e}") from None
        if not isinstance(data, dict):
            got = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
            raise SystemExit(f"convsweep: {path}: {got}: a sweep file names its experiments under `experiments:` "
                             f"({_shown(CPU_SWEEP)} is one)")

    @staticmethod
    def shell_prefix(deployment_methods=()) -> str:
        """Snakemake's shell prefix for the rules: its strict mode, and a `convsweep` shell function
        that runs this checkout's convsweep (its directory first on PYTHONPATH), whatever is
        installed elsewhere; --checkout makes a job refuse if that ever fails. The Python is the
        one running Snakemake, or the rule's conda environment's with --sdm conda."""
        root = shlex.quote(str(ROOT))
        conda = any(getattr(method, "name", method) == "CONDA" for method in deployment_methods)
        python = "python" if conda else shlex.quote(sys.executable)
        prefix = (f"set -euo pipefail; convsweep() {{ PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}} "
                  f'{python} -m convsweep --checkout {root} "$@"; }}; ')
        return prefix.replace("{", "{{").replace("}", "}}")  # Snakemake formats the prefix with the command

    @cached_property
    def _by_id(self) -> dict[tuple[str, str], JobSpec]:
        return {(j.experiment, j.job_id): j for j in self.jobs}

    @property
    def schema_file(self) -> str:
        """experiments.yaml's schema as convsweep applies it (the axes' properties added: convsweep.base.axes),
        as a file: Snakemake's validate reads a path."""
        from convsweep.base.schema import schema_file

        return str(schema_file("experiments"))

    @property
    def results_dir(self) -> str:
        return self.config.results_dir

    @property
    def db_url(self) -> str:
        return self.config.db_url

    @property
    def arch(self) -> str:
        return self.config.data["arch"]

    def _bench_file(self) -> str | None:
        """The bench result whose ceilings the roofline draws (config `bench`), checked while the
        sweep is planned: a missing or wrong file is one line now, not a failed report later."""
        from convsweep.analysis.reading import load_ceilings

        path = self.config.data.get("bench")
        if path is None:
            return None
        resolved = Path(path) if Path(path).is_absolute() else ROOT / path
        try:
            load_ceilings(resolved)
        except ConvsweepError as e:
            raise ConvsweepError(f"{self.config.path}: bench: {str(e).removeprefix(f'--bench {resolved}: ')}") from None
        return str(resolved)

    def report_options(self) -> list[str]:
        """The report command's extra arguments (the rule quotes each): the bench file's ceilings for
        the roofline, if any."""
        return ["--bench", self.bench] if self.bench else []

    @property
    def experiments(self) -> list[str]:
        return list(self.config.experiments)

    def job(self, experiment: str, job_id: str) -> JobSpec:
        return self._by_id[(experiment, job_id)]

    def run_files(self, experiment: str) -> list[str]:
        """The results ingest_results stores: every job's, less those this machine leaves out (left_out)."""
        return [self.run_file(experiment, job_id) for job_id in self._job_ids(experiment)
                if self.runs_here(experiment, job_id)]

    def run_file(self, experiment: str, job_id: str) -> str:
        return f"{self.results_dir}/{experiment}/runs/{job_id}.json"

    def profile_files(self, experiment: str) -> list[str]:
        """The Nsight Compute profile of each GPU job of an experiment with `ncu: true` or `auto` (none otherwise,
        nor where this machine leaves the GPU jobs out)."""
        return [] if self.left_out else [self.profile_file(experiment, job_id)
                                         for job_id in self._profiled_job_ids(experiment)]

    def profile_file(self, experiment: str, job_id: str) -> str:
        return f"{self.results_dir}/{experiment}/ncu/{job_id}.json"

    def _job_ids(self, experiment: str) -> list[str]:
        return [j.job_id for j in self.jobs if j.experiment == experiment]

    def _profiled_job_ids(self, experiment: str) -> list[str]:
        if not self.config.experiments[experiment]["ncu"]:
            return []
        return [job_id for job_id in self._job_ids(experiment) if self.gpus(experiment, job_id)]

    def ncu(self, experiment: str) -> str:
        """The experiment's `ncu:` as profile-job takes it: true (ncu required) or auto."""
        return "auto" if self.config.experiments[experiment]["ncu"] == "auto" else "true"

    def result_folders(self, experiment: str) -> list[str]:
        """What ingest_results reads: the experiment's runs/ folder, ncu/ when it profiles and winners/ when it
        confirms winners (after runs/: a confirmation names stored runs). Folders
        rather than the files, so the command stays one line however many jobs there are."""
        return [f"{self.results_dir}/{experiment}/runs"] + (
            [f"{self.results_dir}/{experiment}/ncu"] if self.profile_files(experiment) else []) + (
            [f"{self.results_dir}/{experiment}/winners"] if self.winners_files(experiment) else [])

    @cached_property
    def _winner_groups(self) -> dict[str, dict[str, list[JobSpec]]]:
        groups: dict[str, dict[str, list[JobSpec]]] = {e: {} for e in self.experiments}
        for job in self.jobs:
            if self.config.experiments[job.experiment]["confirm"]["top"] and job.streams == 1 \
                    and job.submissions is None and self.gpus(job.experiment, job.job_id):
                groups[job.experiment].setdefault(job.winners_id, []).append(job)
        # A cell of one setting has nothing to tell apart.
        return {e: {g: jobs for g, jobs in cells.items() if len(jobs) > 1 or self._settings(jobs[0]) > 1}
                for e, cells in groups.items()}

    def _settings(self, job: JobSpec) -> int:
        settings = job.settings()
        return settings.budget or len(settings.chosen)

    def winner_groups(self, experiment: str) -> list[str]:
        """The confirm jobs of an experiment (convsweep.measure.confirm): one per cell of its one-stream GPU jobs that
        measure two settings or more between them, where `confirm: top` is not 0; no class's (no process is shared)."""
        return list(self._winner_groups[experiment])

    def winners_file(self, experiment: str, group: str) -> str:
        return f"{self.results_dir}/{experiment}/winners/{group}.json"

    def winners_files(self, experiment: str) -> list[str]:
        """The confirm jobs' files ingest_results stores: none where this machine leaves the GPU jobs out."""
        return [] if self.left_out else [self.winners_file(experiment, group)
                                         for group in self.winner_groups(experiment)]

    def winners_inputs(self, experiment: str, group: str) -> list[str]:
        """A confirm job's inputs: the result files of its cell's jobs."""
        return [self.run_file(experiment, job.job_id) for job in self._winner_groups[experiment][group]]

    def winners_spec_file(self, experiment: str, group: str) -> str:
        return f"{self.results_dir}/{experiment}/specs/{group}.json"

    def winners_spec(self, experiment: str, group: str) -> dict:
        """What `convsweep confirm-job` reads (convsweep.measure.confirm.ConfirmSpec)."""
        jobs = self._winner_groups[experiment][group]
        confirm = self.config.experiments[experiment]["confirm"]
        return {"experiment": experiment, "group_id": group, "job": jobs[0].to_dict(),
                "results": self.winners_inputs(experiment, group), "top": confirm["top"], "rounds": confirm["rounds"]}

    def ingested_file(self, experiment: str) -> str:
        return f"{self.results_dir}/{experiment}/ingested.json"

    @cached_property
    def store_id(self) -> str:
        """Which store ingest_results' records are made for: a parameter of the rule, so that Snakemake
        stores an experiment's results again when it changes (a deleted database, another file or
        database at the same URL), where the records alone would say "Nothing to be done". A store that
        is missing or has no stamp gets a new one, never seen before, which check_store writes into it
        before any job runs, so the next sweep finds what it recorded."""
        found = store_identity(self.db_url)
        if found is None:
            self._new_stamp = secrets.randbelow(2**31 - 1) + 1  # a positive 32-bit integer, as the field holds
            found = f"stamp {self._new_stamp:08x}"
        return found

    def report_files(self, experiment: str) -> list[str]:
        return [f"{self.results_dir}/{experiment}/summary.md", f"{self.results_dir}/{experiment}/report.md"]

    def targets(self) -> list[str]:
        """rule all's inputs: each experiment's ingest record, summary and report, and the result files
        missing from an experiment that was ingested before. Snakemake remakes a missing file only when
        a target needs it, never while the outputs made from it are up to date, so a deleted result would
        otherwise never be measured again, nor a failed ingest retried. Only the missing results are
        named (a fresh sweep has none ingested), so the `all` job that Snakemake prints stays short.
        Where this machine leaves jobs out (left_out): an experiment with none left to run has no targets,
        and left_out_flag is one (removed here, so each `snakemake` makes it again and ends with the table)."""
        targets = []
        for experiment in self.experiments:
            if not self.run_files(experiment):
                continue
            ingested = self.ingested_file(experiment)
            if os.path.exists(ingested):
                targets += [f for f in self.run_files(experiment) + self.profile_files(experiment)
                            + self.winners_files(experiment) if not os.path.exists(f)]
            targets += [ingested, *self.report_files(experiment)]
        if self.left_out:
            Path(self.left_out_flag).unlink(missing_ok=True)
            targets.append(self.left_out_flag)
        return targets

    @property
    def left_out_flag(self) -> str:
        """What rule note_jobs_left_out makes: a file that stands in the DAG for the jobs left out."""
        return f"{self.results_dir}/not-run.flag"

    def runs_here(self, experiment: str, job_id: str) -> bool:
        """Whether the sweep runs this job (run_job) on this machine: all do, but the GPU jobs where it has no GPU."""
        return not self.left_out or not self.gpus(experiment, job_id)

    @cached_property
    def left_out(self) -> str | None:
        """Why this sweep leaves its GPU jobs out (a job's words for this machine), or None: it runs them all.
        Decided when Snakemake first asks for the jobs' files (its executor known), and said, before any job
        runs, with what the machine has. None outside a sweep, in a job's own Snakemake, for a cluster's
        executor (its nodes run the jobs) and where CONVSWEEP_GPU_JOBS=run asks for them."""
        workflow = self._workflow
        if workflow is None or workflow.remote_exec or workflow.subprocess_exec or not workflow.local_exec:
            return None
        from convsweep.device.gpu import count_devices
        from convsweep.device.provenance import probe_machine

        asked = os.environ.get(GPU_JOBS_ENV, "").strip()
        if asked not in ("", "run"):
            raise SystemExit(f"convsweep: {GPU_JOBS_ENV}={asked}: expected `run` (the GPU jobs run on a machine "
                             f"that shows no GPU) or nothing")
        machine = self._probe() if self._probe else probe_machine(count_devices)
        left_out = machine.no_gpu if machine.no_gpu and asked != "run" and self._gpu_units() else None
        quiet = {getattr(q, "name", q) for q in getattr(workflow.output_settings, "quiet", None) or ()}
        if workflow.executor_plugin is not None and "ALL" not in quiet:  # a run or a dry run, not --quiet all
            print(self.machine_block(machine, left_out), file=sys.stderr, flush=True)
            self.submissions_left_out.tell(self.experiments)  # and a class's submissions left out, and why
        return left_out

    def _gpu_units(self) -> int:
        """The sweep's jobs that need a GPU: its GPU cells' run jobs, profiles and confirmations."""
        return (sum(1 for job in self.jobs if self.gpus(job.experiment, job.job_id))
                + sum(len(self._profiled_job_ids(e)) + len(self.winner_groups(e)) for e in self.experiments))

    def machine_block(self, machine: Machine, left_out: str | None) -> str:
        """What this machine has and what the sweep therefore does (convsweep.analysis.outcome.machine_block)."""
        from convsweep.analysis.outcome import machine_block

        gpu_jobs = [job for job in self.jobs if self.gpus(job.experiment, job.job_id)]
        profilers = {job.profiler for job in gpu_jobs if job.timer == "events"}  # nsys times no graph replay
        ncu = {self.ncu(e) for e in self.experiments if self._profiled_job_ids(e)}
        return machine_block(machine, len(self.jobs) - len(gpu_jobs), self._gpu_units(), bool(left_out),
                             profilers, ncu, f"snakemake --configfile {_shown(CPU_SWEEP)}")

    def spec_file(self, experiment: str, job_id: str) -> str:
        """The job's spec, which its command names (write_specs writes it before any job runs)."""
        return f"{self.results_dir}/{experiment}/specs/{job_id}.json"

    def spec(self, experiment: str, job_id: str) -> dict:
        """The job spec a job command reads: `convsweep jobs --json`'s line less the settings, with the sweep."""
        job = self.job(experiment, job_id)
        return {**job.to_dict(), "sweep": job.sweep, "job_id": job.job_id}

    def write_not_run(self) -> None:
        """Called from onstart: each experiment's record of the run jobs it plans (convsweep.analysis.outcome.Planned), of
        those this machine leaves out (NotRun) and of its class's submissions left out (classes.LeftOut), which the end
        of the sweep and the report read; where none is left out, an old record is removed."""
        from convsweep.analysis.outcome import NotRun, Planned

        for experiment in self.experiments:
            path = Path(self.not_run_file(experiment))
            left = self._not_run(experiment)
            try:
                Planned(tuple(self._job_ids(experiment))).write(path.with_name("planned.json"))
                self.submissions_left_out.write(path.parent, experiment)
                if left:
                    NotRun(cast(str, self.left_out), tuple(left)).write(path)  # jobs are left out for its reason
                else:
                    path.unlink(missing_ok=True)
            except OSError as e:
                raise SystemExit(f"convsweep: cannot write {path}: {e.strerror or e}") from None

    def not_run_file(self, experiment: str) -> str:
        return f"{self.results_dir}/{experiment}/not-run.json"

    def _not_run(self, experiment: str) -> list[tuple[str, str]]:
        """(kind, id) of each of the experiment's jobs this machine leaves out, as convsweep.analysis.outcome names kinds."""
        if not self.left_out:
            return []
        return ([("run", job_id) for job_id in self._job_ids(experiment) if not self.runs_here(experiment, job_id)]
                + [("profile", job_id) for job_id in self._profiled_job_ids(experiment)]
                + [("winners", group) for group in self.winner_groups(experiment)])

    def write_specs(self) -> None:
        """Write every job's spec to its spec_file, so that a job's command is a short line naming a file
        instead of a kilobyte of JSON. Called from onstart: before any job runs, never in a dry run. A
        file already holding the same spec is left alone; one that cannot be written stops Snakemake
        with one line."""
        from convsweep.base.fileio import write_json_atomic

        specs = [(self.spec_file(job.experiment, job.job_id), self.spec(job.experiment, job.job_id)) for job in self.jobs]
        specs += [(self.winners_spec_file(e, group), self.winners_spec(e, group))
                  for e in self.experiments for group in self.winner_groups(e)]
        for spec_path, spec in specs:
            path = Path(spec_path)
            try:
                if json.loads(path.read_text()) == spec:
                    continue
            except (OSError, ValueError):
                pass  # absent or unreadable: written below
            try:
                write_json_atomic(path, spec)
            except OSError as e:
                raise SystemExit(f"convsweep: cannot write the job spec {path}: {e.strerror or e}") from None

    def _network(self, job: JobSpec):
        """The job's network, read once per file: Snakemake asks for every job's inputs while it plans."""
        from convsweep.model.network import load_network

        if job.network not in self._networks:
            self._networks[job.network] = load_network(resolve_network_path(job.network))
        return self._networks[job.network]

    def job_sources(self, experiment: str, job_id: str) -> list[str]:
        """What a job's numbers depend on besides its spec: the network file and weights, and for GPU
        jobs every kernel file it compiles (its variants' .cu files, layers.cu, the headers they
        include). Editing any of them re-measures exactly the jobs that use it."""
        job = self.job(experiment, job_id)
        network = self._network(job)
        files = [network.path]
        if network.weights_path is not None:
            files.append(network.weights_path)
        variants = [get_variant(name, job.submissions) for name in dict.fromkeys(job.variants.values())]
        for source in [cast(Path, v.source) for v in variants if not v.is_cpu]:
            files += kernel_sources(source)
        if not all(v.is_cpu for v in variants):
            files += kernel_sources(LAYERS_SOURCE)
        return list(dict.fromkeys(_shown(Path(f)) for f in files))

    def gpus(self, experiment: str, job_id: str) -> int:
        """GPUs the job asks its executor for (`resources: gpu`): none when every layer runs on a CPU
        variant, as the job itself decides (job.run_job), so a cluster holds no GPU for it."""
        job = self.job(experiment, job_id)
        return 0 if all(get_variant(name, job.submissions).is_cpu for name in job.variants.values()) else 1

    @staticmethod
    def local_cores(workflow) -> int | None:
        """The cores of a sweep run on this host, else None: on a cluster the submitting process and the
        job step inside the allocation see different core counts, and a job step asking for more threads
        than its allocation holds is refused by srun ("More processors requested than permitted")."""
        return workflow.resource_settings.cores if workflow.local_exec and not workflow.remote_exec else None

    def threads(self, experiment: str, job_id: str, cores: int | None) -> int:
        """run_job's threads: every core for a job timed on the CPU (the reference variant), so that it
        runs alone (Snakemake caps a job's threads at --cores) and no other job slows its host timings;
        one for a GPU job. One where no core count is given: on a cluster each job has a node's share."""
        return cores if cores and not self.gpus(experiment, job_id) else 1

    def registry_entries(self, experiment: str, job_id: str) -> str:
        """The job's variants' registry entries, hashed (a rule parameter: editing an entry re-measures
        the jobs of that variant)."""
        job = self.job(experiment, job_id)
        return ",".join(f"{n}={get_variant(n, job.submissions).entry_hash}" for n in sorted(set(job.variants.values())))

    def finish(self, targets: Iterable[str] = ()) -> None:
        """onsuccess and onerror: let go of Snakemake's timer, store what finished where an experiment's ingest did not
        run, and print what the sweep left behind, for the experiments `targets` name (Snakemake's: none is all)."""
        from convsweep.analysis.outcome import finish_sweep

        release_scheduler_timer()
        experiments = self.targeted_experiments(targets)
        self._forget_records_of_another_store(experiments)
        status = finish_sweep(self.db_url, [self._experiment_files(e) for e in experiments],
                              cpu_sweep=f"snakemake --configfile {_shown(CPU_SWEEP)}")
        self.submissions_left_out.tell(experiments)  # not the sweep's failure: it ran what it could
        skip_final_collection()
        if status:  # jobs left out, or none of what ran finished ok: the status says so, as for a failed job
            raise SystemExit(status)

    def _forget_records_of_another_store(self, experiments: list[str]) -> None:
        """Remove the ingest records made before this sweep when its store was new (store_id): they were made
        for a store that is gone, and an experiment whose ingest could not run (a job failed) is stored by
        finish_sweep only where no record claims its results stored."""
        if self._new_stamp is None:
            return
        for experiment in experiments:
            record = Path(self.ingested_file(experiment))
            try:
                if record.stat().st_mtime < self._planned_at:
                    record.unlink()
            except FileNotFoundError:
                pass

    def targeted_experiments(self, targets: Iterable[str]) -> list[str]:
        """The experiments whose files `targets` name: all of them for none, or for a rule's name (`all`);
        else those a target path lies in (results/E/..., its own files only). So `snakemake
        results/E/summary.md` never writes another experiment's report, which would then stand as done."""
        targets = list(targets)
        results = Path(self.results_dir).resolve()
        named: set[str] = set()
        for target in targets:
            path = Path(target)
            if len(path.parts) == 1 and not path.suffix:  # a rule, not a file
                return list(self.experiments)
            try:
                named.add(path.resolve().relative_to(results).parts[0])
            except (ValueError, IndexError):  # a file outside the results folder: every experiment's, say
                return list(self.experiments)
        return [e for e in self.experiments if e in named] if targets else list(self.experiments)

    def _experiment_files(self, experiment: str):
        """An experiment's jobs, results and logs as the rules name them, for convsweep.analysis.outcome."""
        from convsweep.analysis.outcome import ExperimentFiles, JobFiles

        logs = Path(self.results_dir, experiment, "logs")
        why = dict.fromkeys(self._not_run(experiment), self.left_out)
        return ExperimentFiles(
            name=experiment,
            jobs=[JobFiles(job_id, Path(self.run_file(experiment, job_id)), logs / f"{job_id}.log",
                           not_run=why.get(("run", job_id)))
                  for job_id in self._job_ids(experiment)]
            + [JobFiles(job_id, Path(self.profile_file(experiment, job_id)), logs / f"ncu-{job_id}.log", kind="profile",
                        not_run=why.get(("profile", job_id)))
               for job_id in self._profiled_job_ids(experiment)]
            + [JobFiles(group, Path(self.winners_file(experiment, group)), logs / f"{group}.log", kind="winners",
                        not_run=why.get(("winners", group)))
               for group in self.winner_groups(experiment)],
            ingested=Path(self.ingested_file(experiment)),
            reports=[Path(f) for f in self.report_files(experiment)],
            report_log=logs / "report.log",
            report_command=self.report_argv(experiment),
            not_run_file=Path(self.not_run_file(experiment)) if why else None)

    def report_argv(self, experiment: str) -> list[str]:
        """make_report's command (workflow/rules/report.smk) as arguments, for a report over the jobs that
        finished when others did not (convsweep.analysis.outcome)."""
        base = f"{self.results_dir}/{experiment}"
        return [sys.executable, "-m", "convsweep", "--checkout", str(ROOT), "report", "--experiment", experiment,
                "--db", self.db_url, "--out", f"{base}/summary.md", "--figures", f"{base}/figures", "--draw",
                "--markdown", f"{base}/report.md", "--html", f"{base}/report.html", "--tables", f"{base}/tables",
                "--allow-empty", *self.report_options()]

    def check_store(self) -> None:
        """Before any job runs: the database must be usable (reachable, an SQLite file that is a
        database, a schema this code knows), so no GPU time is spent on results that cannot be
        stored. Stops Snakemake with one line. A store new to this sweep gets the stamp store_id chose."""
        from sqlalchemy.exc import SQLAlchemyError

        from convsweep.store import open_store

        try:
            engine = open_store(self.db_url)
        except ConvsweepError as e:
            raise SystemExit(f"convsweep: {e}") from None
        try:
            if self._new_stamp is not None:
                stamp_store(engine, self._new_stamp)
        except SQLAlchemyError:
            pass  # left without a stamp, the store gets a new one next time: its results are stored again, unchanged
        finally:
            engine.dispose()
