"""What the Hopper kernels' tests share (tma_conv1, wgmma_conv2, wgmma_fused_network; not a test file):
fresh random conv inputs and their float64 reference, the sm_90a build's SASS and its one-line refusal
elsewhere, a `gpu` fixture that skips below the variant's compute capability, and a job's logits held
against the reference. check_variant, spec and run_job stay in test_gpu.py, which every GPU test uses."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from convsweep.model.checks import normwise_error
from convsweep.device.compile import compile_source, compile_variant
from convsweep.base.errors import CompileError
from convsweep.model.reference import conv2d_reference, maxpool2d_reference

# -- without a GPU ---------------------------------------------------------------------------------


def fresh_conv_inputs(C: int, M: int, H: int, W: int, K: int, B: int = 1):
    """New standard-normal float32 x [B, C, H, W], w [M, C, K, K] and b [M] on every call."""
    rng = np.random.default_rng()
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((M, C, K, K)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    return x, w, b


def conv_relu_pool_reference(x, w, b, pool: int) -> np.ndarray:
    """float64 conv (stride 1) + bias, ReLU and a pool x pool max-pool of stride pool: what the kernels fuse."""
    conv = conv2d_reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1)
    return maxpool2d_reference(np.maximum(conv, 0.0), pool, pool)


def replay_error(y: np.ndarray, ref: np.ndarray) -> float:
    """A replay's output (NaN where it never wrote) against its float64 reference, normwise."""
    assert np.isfinite(y).all(), "unwritten outputs"
    assert y.shape == ref.shape
    return normwise_error(y, ref)


def find_disassembler() -> list[str] | None:
    """nvdisasm or cuobjdump on PATH, in an installed nvidia wheel (nvidia/cu*/bin) or under CUDA_HOME."""
    places = []
    try:
        import nvidia

        places += [p for root in nvidia.__path__ for p in sorted(Path(root).glob("cu*/bin"))]
    except ImportError:
        pass
    places += [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for tool, args in (("nvdisasm", ["-c"]), ("cuobjdump", ["-sass"])):
        found = shutil.which(tool) or next((str(p / tool) for p in places if (p / tool).is_file()), None)
        if found and os.access(found, os.X_OK):
            return [found, *args]
    return None


# For a test that reads SASS: a skipif mark, so the skip is reported at the test, not here.
needs_disassembler = pytest.mark.skipif(
    find_disassembler() is None,
    reason="no nvdisasm or cuobjdump on PATH, in the venv's nvidia packages or under CUDA_HOME")


def sass_of(variant, shape, tmp_path) -> str:
    """The SASS of `variant` built for sm_90a at its defaults (the test carries needs_disassembler)."""
    tool = find_disassembler()
    cubin = tmp_path / f"{variant.name}.cubin"
    cubin.write_bytes(compile_variant(variant, variant.defaults(), "sm_90a", shape).cubin)
    return subprocess.run([*tool, str(cubin)], capture_output=True, text=True, check=True).stdout


def assert_refused_in_one_line(variant, target: str, shape, expected: str) -> None:
    """Building `variant` for `target`, from the registry and from its bare source, raises `expected` alone."""
    defines = variant.defines(variant.defaults(), shape)
    for build in (lambda: compile_variant(variant, variant.defaults(), target, shape),
                  lambda: compile_source(variant.source, variant.name, defines, target)):
        with pytest.raises(CompileError) as info:
            build()
        assert str(info.value) == expected and "\n" not in str(info.value)


def setting_id(params: dict) -> str:
    """A test id for one setting of the tunables: {"WG": 1, "PR": 2} is WG1-PR2."""
    return "-".join(f"{k}{v}" for k, v in params.items())


# -- on a GPU (conftest skips tests marked gpu, with the reason, where there is none) --------------


def gpu_fixture(variant):
    """A module-scoped `gpu` fixture for `variant`'s tests: skips them, naming both, on a GPU below its min_cc."""

    @pytest.fixture(scope="module")
    def gpu():
        from convsweep.device.gpu import Gpu

        with Gpu() as g:
            if g.compute_capability < variant.min_cc:
                pytest.skip(f"{variant.name} needs compute capability {variant.min_cc}, "
                            f"{g.name} has {g.compute_capability}")
            yield g

    return gpu


def assert_job_classifies_like_the_reference(variants: dict[str, str], tmp_path, batch: int = 2000) -> None:
    """LeNet-86 as a lone job with `variants` on its convs, every pass checked: ok, and the reference's accuracy."""
    from test_gpu import reference_accuracy, run_job, spec

    run = spec("events", batch=batch, repeats=1, variants=variants, params={"conv1": {}, "conv2": {}})
    result = run_job(run, tmp_path / "r.json")
    assert result.status == "ok", result.error
    assert abs(result.accuracy - reference_accuracy(batch)) <= 0.005


def measure_like_the_reference(run, tolerance: float):
    """`run` measured with its logits (poisoned before each pass): all written, within `tolerance` of
    float64 and near the reference's accuracy; the result, for the caller's own checks."""
    from convsweep.measure.settings import measure
    from test_gpu import reference_accuracy

    result = measure(run, keep_logits=True)
    assert result.status == "ok", result.error
    assert np.isfinite(result.logits).all() and result.logits.shape == (run.batch, 10)
    assert result.max_rel_err <= tolerance
    assert abs(result.accuracy - reference_accuracy(run.batch)) <= 0.005 + 1 / run.batch
    return result
