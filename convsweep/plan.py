"""The Snakefile's view of a sweep: which files each rule makes and what it passes on.

Snakemake needs names and paths; convsweep's config module knows the jobs. This keeps the
translation in one place so the rule files hold wiring only.
"""
from __future__ import annotations

import json
import shlex
from functools import cached_property
from pathlib import Path

from .config import ROOT, Config, JobSpec, canonical_hash, expand_config, validate
from .variants import get_variant


def build_id(variant: str, params: dict) -> str:
    return f"{variant}-{canonical_hash(params)[:10]}"


class SweepPlan:
    def __init__(self, config: dict, config_path: str | Path = "experiments.yaml"):
        self.config = Config(Path(config_path), validate(config, str(config_path)))
        # Expanded now, so a bad variant or tunable stops the workflow while it is parsed,
        # with one line, instead of inside some rule's input function.
        self.jobs: list[JobSpec] = expand_config(self.config)

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

    @property
    def experiments(self) -> list[str]:
        return list(self.config.experiments)

    def job(self, experiment: str, job_id: str) -> JobSpec:
        return self._by_id[(experiment, job_id)]

    def run_files(self, experiment: str) -> list[str]:
        return [f"{self.results_dir}/{experiment}/runs/{j.job_id}.json" for j in self.jobs if j.experiment == experiment]

    def spec_json(self, experiment: str, job_id: str) -> str:
        job = self.job(experiment, job_id)
        return json.dumps({**job.to_dict(), "sweep": job.sweep}, sort_keys=True)

    def _builds(self, job: JobSpec) -> dict[str, tuple[str, dict]]:
        """build id -> (variant, macros): a variant that fixes shape values builds once per layer shape."""
        from .network import load_network
        from .runner import conv_shape

        network = load_network(ROOT / job.network if not Path(job.network).is_absolute() else job.network)
        builds = {}
        for layer in network.conv_layers:
            var = get_variant(job.variants[layer.name])
            if not var.is_cpu:
                params = var.resolve_params(job.params.get(layer.name), f"params.{layer.name}")
                fused = network.fused_layers(layer.name, var.fuses)  # a fused max-pool sets P, PS
                macros = var.defines(params, conv_shape(layer, 1, network.dtype, fused))
                builds[build_id(var.name, macros)] = (var.name, macros)
        return builds

    @cached_property
    def _all_builds(self) -> dict[str, tuple[str, dict]]:
        out = {}
        for job in self.jobs:
            out.update(self._builds(job))
        return out

    def build_files(self, experiment: str, job_id: str) -> list[str]:
        return [f"{self.results_dir}/builds/{b}.json" for b in sorted(self._builds(self.job(experiment, job_id)))]

    def compile_args(self, build: str) -> str:
        """Command-line arguments of `convsweep compile` for one build id."""
        variant, macros = self._all_builds[build]
        tunables = get_variant(variant).params
        args = [variant] + [f"--{'param' if k in tunables else 'define'}={k}={json.dumps(v)}" for k, v in sorted(macros.items())]
        return " ".join(shlex.quote(a) for a in args)
