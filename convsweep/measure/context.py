"""What every setting of a job shares while it is measured (`JobContext`): its spec and settings,
the network, the batch, the variants it times, and the provenance each measurement repeats.

It sits below job.py and measure.py, which both read it: job.py decides where settings are measured
and measure.py measures them, importing this and never job.py. Its imports are light (no numpy, no
GPU code), so a job process starts nsys or the CUDA context before the heavy ones load.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from convsweep.device.compile import LAYERS_SOURCE, source_hash
from convsweep.sweep.config import JobSpec, RunSpec, Settings
from convsweep.base.errors import ShapeError
from convsweep.base.paths import relative_to_root, resolve_network_path
from convsweep.device.provenance import git_state
from .record import GridPlace, Measurement
from convsweep.model.variants import Variant, get_variant

if TYPE_CHECKING:
    from convsweep.inputs.batch import Batch
    from convsweep.model.network import Network


def kernel_sources_of(variants: dict[str, Variant]) -> dict[str, str]:
    """{kernel file: source hash} of every kernel a job runs: its variants' files and, on the GPU,
    layers.cu. Known before anything compiles, so a run that failed still says what code it tried."""
    files = [cast(Path, v.source) for v in variants.values() if not v.is_cpu]  # a GPU variant has its source
    if files:
        files.append(LAYERS_SOURCE)
    return {relative_to_root(f): source_hash(f) for f in dict.fromkeys(files)}


def timed_variants(network: Network, variants: dict[str, Variant]) -> dict[str, Variant]:
    """The layer -> variant map a job times: a conv layer that an earlier layer's variant computes
    (a fused network swallows the later convs) has no kernel, no op time and no build of its own.
    A variant that does not fit its layer is left for the measurement to report."""
    try:
        swallowed = network.swallowed({layer: v.fuses for layer, v in variants.items() if not v.is_cpu})
    except ShapeError:
        return variants
    return {layer: v for layer, v in variants.items() if layer not in swallowed}


@dataclass
class JobContext:
    """What every setting of a job shares: its spec and settings, the batch, the variants, and the
    provenance each measurement repeats (so each stands alone in the store)."""

    spec: JobSpec
    runs: list[RunSpec]
    settings: Settings
    network: Network
    batch: Batch | None
    variants: dict[str, Variant]
    git: dict[str, Any]  # the checkout's HEAD and whether it differs from it
    sources: dict[str, str]  # kernel file -> its source hash
    keep_logits: bool = False  # leave each setting's output array in its measurement (never in files)

    @classmethod
    def open(cls, spec: JobSpec) -> JobContext:
        """The settings and provenance; the batch is loaded by measure_settings (a failure to load
        it is the measurements' failure, not the job's)."""
        from convsweep.model.network import load_network

        settings = spec.settings()
        network = load_network(resolve_network_path(spec.network))
        variants = timed_variants(network, {layer: get_variant(name) for layer, name in spec.variants.items()})
        return cls(spec, spec.runs(), settings, network, None, variants, git_state(), kernel_sources_of(variants))

    def measurement(self, index: int) -> Measurement:
        """Setting `index`'s measurement before measuring: identity and provenance; failed until measured."""
        run, spec, settings = self.runs[index], self.spec, self.settings
        return Measurement.new(spec.job_id, run.run_key, run.to_dict(), spec.sweep, self.git, self.sources,
                               GridPlace(spec.job_key, index, settings.budget or len(self.runs), settings.valid,
                                         spec.search))
