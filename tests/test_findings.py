"""convsweep.device.findings: what a kernel's PTX does that a convolution needs not, read from what NVRTC makes of small
kernels written to do each thing (and of honest ones, which must show nothing), and from PTX text where NVRTC
cannot build the thing without options convsweep never passes (a launch from the device needs -rdc)."""
from __future__ import annotations

import pytest

from convsweep.device.findings import FINDINGS, describe, scan_ptx


def ptx_of(tmp_path, source: str) -> str:
    from convsweep.device.compile import compile_ptx, nvrtc_version

    try:
        nvrtc_version()
    except Exception as e:  # no NVRTC library: nothing to compile with
        pytest.skip(f"NVRTC is not importable here ({type(e).__name__}: {e})")
    path = tmp_path / "k.cu"
    path.write_text(source)
    return compile_ptx(path, "k", {}, "sm_90a")


CASES = {
    "honest": ('extern "C" __global__ void k(float *y, const float *x, int n) {\n'
               '    __shared__ float s[256]; int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
               '    s[threadIdx.x] = i < n ? x[i] : 0.f; __syncthreads(); if (i < n) y[i] = 2.f * s[threadIdx.x]; }',
               []),
    "a memo table": ('__device__ float table[1024];\n'
                     'extern "C" __global__ void k(float *y, const float *x, int n) {\n'
                     '    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) { table[i % 1024] = x[i]; y[i] = x[i]; } }',
                     ["global_write"]),
    "a launch counter": ('__device__ unsigned long long launches;\n'
                         'extern "C" __global__ void k(float *y) { if (threadIdx.x == 0) atomicAdd(&launches, 1ull); y[0] = 1; }',
                         ["global_write"]),
    "a write in a function it calls": ('__device__ int seen[8];\n'
                                       '__device__ __noinline__ void remember(int i) { seen[i & 7] = i; }\n'
                                       'extern "C" __global__ void k(int *y) { remember(threadIdx.x); y[0] = 1; }',
                                       ["global_write"]),
    "a clock": ('extern "C" __global__ void k(long long *y) { y[0] = clock64(); }', ["clock"]),
    "a global timer": ('extern "C" __global__ void k(unsigned long long *y) {\n'
                       '    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); y[0] = t; }',
                       ["clock"]),
    "an L2 policy": ('extern "C" __global__ void k(float *y, const float *x) {\n'
                     '    unsigned long long p; asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));\n'
                     '    float v; asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(x), "l"(p));\n'
                     '    y[0] = v; }',
                     ["l2_policy"]),
    "a constant it only reads": ('__constant__ float w[16];\n'
                                 'extern "C" __global__ void k(float *y) { y[threadIdx.x] = w[threadIdx.x & 15]; }', []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_nvrtcs_ptx_shows_of_each_kernel(tmp_path, case):
    source, expected = CASES[case]
    assert scan_ptx(ptx_of(tmp_path, source)) == {"k": expected}


def test_a_launch_from_the_device_shows_in_ptx():
    ptx = """
.extern .func  (.param .b32 func_retval0) cudaLaunchDeviceV2
(
	.param .b64 cudaLaunchDeviceV2_param_0,
	.param .b64 cudaLaunchDeviceV2_param_1
)
;
.visible .entry parent(
	.param .u64 parent_param_0
)
{
	.reg .b64 	%rd<4>;
	call.uni (retval0), cudaLaunchDeviceV2, (param0, param1);
	ret;
}
"""
    assert scan_ptx(ptx) == {"parent": ["device_launch"]}


def test_the_description_names_each_kernel_and_what_it_does():
    found = {"a": ["global_write", "clock"], "b": []}
    assert describe(found) == f"a: {FINDINGS['global_write']}, {FINDINGS['clock']}"
    assert describe(found, kernels={"b"}) == "" and describe(None) == ""


def test_every_shipped_variant_is_clean():
    """A finding is not a verdict, but the shipped kernels have none: a new one in a change is worth a look.

    Read from each build's own findings (compile_source scans the PTX NVRTC makes of the build, as the store
    records it): these builds (defaults, sm_90a, LeNet-86's layers) are among those test_compile and `convsweep
    compile all` make, so the session's build cache (tests/conftest.py) makes each once; missing ones compile
    on a thread per core."""
    from convsweep.device.compile import BuildRequest, compile_all, nvrtc_version
    from convsweep.base.errors import CompileError
    from convsweep.model.network import load_network
    from convsweep.model.variants import load_registry

    try:
        nvrtc_version()
    except Exception as e:
        pytest.skip(f"NVRTC is not importable here ({type(e).__name__}: {e})")
    network = load_network("networks/lenet86.yaml")
    requests = {}
    for variant in load_registry().values():
        if variant.is_cpu:
            continue
        layer = next(layer for layer in network.conv_layers if _fits(network, layer, variant))
        shape = network.variant_shape(layer, variant.fuses, absorbs=variant.absorbs_input)
        requests[variant.name] = BuildRequest.of(variant.source, variant.name,
                                                 variant.defines(variant.defaults(), shape))
    with compile_all(list(requests.values()), "sm_90a") as pending:
        builds = pending.wait()
    for name, request in requests.items():
        build = builds[request]
        if isinstance(build, CompileError):
            raise build
        assert build.kernels and not any(build.findings.values()), (name, build.findings)


def _fits(network, layer, variant) -> bool:
    """Whether `variant` can run conv `layer` (its fusions and the registry's constraints)."""
    try:
        variant.check_shape(network.variant_shape(layer, variant.fuses, absorbs=variant.absorbs_input),
                            variant.defaults())
        return True
    except Exception:
        return False
