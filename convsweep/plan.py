"""The Snakefile's view of a sweep: which files each rule makes, what it depends on, and the
command line that runs this checkout's convsweep.

Snakemake needs names and paths; convsweep's config module knows the jobs. This keeps the
translation in one place so the rule files hold wiring only.
"""
from __future__ import annotations

import gc
import json
import shlex
import sys
import threading
from functools import cached_property
from pathlib import Path

from .compile import LAYERS_SOURCE, kernel_sources
from .config import Config, JobSpec, expand_config, validate
from .errors import ConvsweepError
from .paths import ROOT, check_same_checkout, resolve_network_path
from .variants import get_variant


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


class SweepPlan:
    def __init__(self, config: dict, config_path: str | Path = "experiments.yaml", checkout: str | Path | None = None):
        if checkout is not None:  # the Snakefile's own directory: plan with its convsweep, or not at all
            check_same_checkout(checkout)
        self.config = Config(Path(config_path), validate(config, str(config_path)))
        # Expanded now, so a bad variant or tunable stops the workflow while it is parsed,
        # with one line, instead of inside some rule's input function.
        self.jobs: list[JobSpec] = expand_config(self.config)
        self._networks: dict[str, object] = {}
        self.bench: str | None = self._bench_file()  # checked now, with the rest of the config

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
        from .plot import load_ceilings

        path = self.config.data.get("bench")
        if path is None:
            return None
        resolved = Path(path) if Path(path).is_absolute() else ROOT / path
        try:
            load_ceilings(resolved)
        except ConvsweepError as e:
            raise ConvsweepError(f"{self.config.path}: bench: {str(e).removeprefix(f'--bench {resolved}: ')}") from None
        return str(resolved)

    def report_options(self) -> str:
        """The report command's extra options: the bench file's ceilings for the roofline, if any."""
        return f"--bench {shlex.quote(self.bench)}" if self.bench else ""

    @property
    def experiments(self) -> list[str]:
        return list(self.config.experiments)

    def job(self, experiment: str, job_id: str) -> JobSpec:
        return self._by_id[(experiment, job_id)]

    def run_files(self, experiment: str) -> list[str]:
        return [f"{self.results_dir}/{experiment}/runs/{j.job_id}.json" for j in self.jobs if j.experiment == experiment]

    def profile_files(self, experiment: str) -> list[str]:
        """The Nsight Compute profile of each GPU job of an experiment with `ncu: true` (none otherwise)."""
        if not self.config.experiments[experiment]["ncu"]:
            return []
        return [f"{self.results_dir}/{experiment}/ncu/{j.job_id}.json" for j in self.jobs
                if j.experiment == experiment and self.gpus(experiment, j.job_id)]

    def spec_json(self, experiment: str, job_id: str) -> str:
        job = self.job(experiment, job_id)
        return json.dumps({**job.to_dict(), "sweep": job.sweep}, sort_keys=True)

    def _network(self, job: JobSpec):
        """The job's network, read once per file: Snakemake asks for every job's inputs while it plans."""
        from .network import load_network

        if job.network not in self._networks:
            self._networks[job.network] = load_network(resolve_network_path(job.network))
        return self._networks[job.network]

    def job_sources(self, experiment: str, job_id: str) -> list[str]:
        """What a job's numbers depend on besides its spec: the network file and weights, and for GPU
        jobs every kernel file it compiles (its variants' .cu files, layers.cu, the headers they
        include). Editing any of them re-measures exactly the jobs that use it."""
        job = self.job(experiment, job_id)
        network = self._network(job)
        files = [str(network.path)]
        if network.weights_path is not None:
            files.append(str(network.weights_path))
        variants = [get_variant(name) for name in dict.fromkeys(job.variants.values())]
        for source in [v.source for v in variants if not v.is_cpu]:
            files += [str(p) for p in kernel_sources(source)]
        if not all(v.is_cpu for v in variants):
            files += [str(p) for p in kernel_sources(LAYERS_SOURCE)]
        return list(dict.fromkeys(files))

    def gpus(self, experiment: str, job_id: str) -> int:
        """GPUs the job asks its executor for (`resources: gpu`): none when every layer runs on a CPU
        variant, as the job itself decides (job.run_job), so a cluster holds no GPU for it."""
        job = self.job(experiment, job_id)
        return 0 if all(get_variant(name).is_cpu for name in job.variants.values()) else 1

    def registry_entries(self, experiment: str, job_id: str) -> str:
        """The job's variants' registry entries, hashed (a rule parameter: editing an entry re-measures
        the jobs of that variant)."""
        job = self.job(experiment, job_id)
        return ",".join(f"{name}={get_variant(name).entry_hash}" for name in sorted(set(job.variants.values())))

    def check_store(self) -> None:
        """Before any job runs: the database must be usable (reachable, an SQLite file that is a
        database, a schema this code knows), so no GPU time is spent on results that cannot be
        stored. Stops Snakemake with one line."""
        from .store import open_store

        try:
            open_store(self.db_url).dispose()
        except ConvsweepError as e:
            raise SystemExit(f"convsweep: {e}") from None
