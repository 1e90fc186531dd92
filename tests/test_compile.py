"""NVRTC compiles on a CPU-only machine: every kernel, every registered parameter combination."""
import shutil
from dataclasses import replace

import pytest

from convsweep.device.compile import BuildRequest, compile_all, compile_ptx, compile_source, compile_variant, parse_ptxas_log
from convsweep.base.errors import CompileError, ShapeError
from convsweep.base.paths import KERNELS_DIR
from convsweep.model.variants import ConvShape, load_registry

# Variants that compile the layer shape in are built for each of these they accept (LeNet-86's two
# convs with their pools, and a stride-2 one with an overlapping pool).
SHAPES = [ConvShape(1, 1, 4, 86, 86, 7, 1, 2, 2), ConvShape(1, 4, 16, 40, 40, 7, 1, 4, 4),
          ConvShape(1, 8, 2, 17, 17, 3, 2, 3, 2)]

GPU_VARIANTS = [(name, params) for name, var in load_registry().items() if not var.is_cpu
                for params in var.all_combinations()]


def accepted_shapes(var, params) -> list[ConvShape]:
    if var.fuses_tail:  # a fused network is built for a network: LeNet-86's, from its first conv on
        from convsweep.model.network import load_network
        from convsweep.base.paths import ROOT

        lenet = load_network(ROOT / "networks" / "lenet86.yaml")
        return [lenet.variant_shape(lenet.layer("conv1"), var.fuses)]
    shapes = []
    for shape in SHAPES:
        shape = shape if var.fuses_pool else replace(shape, P=0, PS=0)
        try:
            var.check_shape(shape, params)
        except ShapeError:
            continue
        shapes.append(shape)
    return shapes


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("name, params", GPU_VARIANTS, ids=lambda v: str(v))
def test_every_variant_and_parameter_combination_compiles(name, params, arch):
    var = load_registry()[name]
    shapes = accepted_shapes(var, params) if var.compile_time else [None]
    assert shapes, f"{name} {params}: accepts none of the test shapes"
    if var.arch and arch not in var.arch:  # registry arch rules the target out
        with pytest.raises(CompileError, match=rf"^variant '{name}' needs .* \(registry arch\), got {arch}$"):
            compile_variant(var, params, arch, shapes[0])
        return
    for shape in shapes:
        build = compile_variant(var, params, arch, shape)
        assert build.cubin[:4] == b"\x7fELF"
        names = {k.name for k in build.kernels}
        assert set(var.kernel_names) <= names, f"{name}: launches name kernels the module lacks"
        for k in build.kernels:
            assert k.registers > 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_network_layer_kernels_compile(arch):
    build = compile_source(KERNELS_DIR / "layers.cu", "layers", {}, arch)
    assert {"relu_inplace", "maxpool2d", "dense"} <= {k.name for k in build.kernels}


def test_second_compile_hits_the_cache_and_options_change_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path))
    var = load_registry()["naive"]
    first = compile_variant(var, var.defaults(), "sm_90")
    again = compile_variant(var, var.defaults(), "sm_90")
    other = compile_variant(var, {**var.defaults(), "BLOCK": 128}, "sm_90")
    assert not first.cache_hit and again.cache_hit and not other.cache_hit
    assert again.cubin == first.cubin and again.kernels == first.kernels
    assert other.options_hash != first.options_hash
    assert not compile_variant(var, var.defaults(), "sm_80").cache_hit


# A build cache entry changed, cut short, forged, linked or of another user is compiled again: tests/test_caches.py.


def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(KERNELS_DIR / "common.cuh", kernels)
    bad = kernels / "broken.cu"
    bad.write_text('#include "common.cuh"\nextern "C" __global__ void conv_forward(CONV_ARGS) {\n  y[0] = undefined_name;\n}\n')
    with pytest.raises(CompileError) as err:
        compile_source(bad, "broken", {}, "sm_90")
    message = str(err.value)
    assert "broken.cu:3:" in message and "undefined_name" in message and "\n" not in message
    assert "error" in err.value.log


def test_editing_an_included_header_rebuilds_the_kernel(tmp_path, monkeypatch):
    """The build cache's key covers every checkout header a kernel includes, transitively: an edit to
    mma_f16.cuh (wgmma_fused_network.cu -> fused_dense.cuh -> mma_f16.cuh) is compiled, not served from the
    cache; undone, the first build is a cache hit again."""
    from convsweep.device.compile import kernel_sources, source_hash
    from convsweep.model.network import load_network
    from convsweep.base.paths import ROOT

    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS_DIR, kernels, ignore=shutil.ignore_patterns("*.yaml"))
    var = load_registry()["wgmma_fused_network"]
    source, header = kernels / "wgmma_fused_network.cu", kernels / "mma_f16.cuh"
    assert {"fused_dense.cuh", "mma_f16.cuh", "wgmma.cuh", "tma.cuh", "common.cuh"} <= {p.name for p in kernel_sources(source)}
    network = load_network(ROOT / "networks/lenet86.yaml")
    defines = var.defines(var.defaults(), network.variant_shape(network.layer("conv1"), var.fuses, 1))
    first = compile_source(source, var.name, defines, "sm_90a")
    text, before = header.read_text(), source_hash(source)
    header.write_text(text + "\n#error an edit to a header two includes down\n")
    assert source_hash(source) != before
    with pytest.raises(CompileError, match="an edit to a header two includes down"):
        compile_source(source, var.name, defines, "sm_90a")
    header.write_text(text)
    again = compile_source(source, var.name, defines, "sm_90a")
    assert source_hash(source) == before and again.cache_hit and again.cubin == first.cubin


def test_ptxas_log_parsing():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
ptxas         .     256 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
"""
    a, b = parse_ptxas_log(log)
    assert (a.name, a.registers, a.shared_bytes, a.local_bytes, a.spill_store_bytes, a.spill_load_bytes) == ("a", 40, 2048, 256, 8, 12)
    assert (b.name, b.registers, b.shared_bytes, b.local_bytes) == ("b", 10, 0, 0)


def test_shape_fixing_variants_build_per_shape_and_need_the_shape():
    var = load_registry()["restrict_unroll"]
    first, second = (compile_variant(var, var.defaults(), "sm_90", s) for s in SHAPES[:2])
    assert first.params["K_FIXED"] == 7 and (first.params["C_FIXED"], second.params["C_FIXED"]) == (1, 4)
    assert first.options_hash != second.options_hash
    from convsweep.base.errors import ConfigError

    with pytest.raises(ConfigError, match="compiled per layer shape"):
        compile_variant(var, var.defaults(), "sm_90")


def test_the_default_sweep_jobs_build_what_they_run():
    """A job's build requests (layers.cu, and each conv layer's variant at the shape it runs, a fused
    max-pool included) all compile for sm_90a (the default sweep runs wgmma_fused_network, which needs
    it), and inside compile_all the runner's compiles are those builds."""
    from convsweep.measure.settings import build_requests
    from convsweep.model.network import load_network
    from convsweep.base.paths import ROOT
    from convsweep.app.plan import SweepPlan
    from convsweep.model.variants import get_variant
    from convsweep.base.yamlio import load_yaml

    plan = SweepPlan(load_yaml((ROOT / "experiments.yaml").read_text()), ROOT / "experiments.yaml")
    network = load_network(ROOT / "networks" / "lenet86.yaml")
    for job in plan.jobs:
        variants = {layer: get_variant(name) for layer, name in job.variants.items()}
        if all(v.is_cpu for v in variants.values()):
            continue
        requests = [r for run in job.runs() for r in build_requests(network, variants, run)]
        with compile_all(requests, "sm_90a", workers=2) as pending:
            builds = pending.wait()
            assert set(builds) == set(requests) and all(b.kernels for b in builds.values())
            for run in job.runs():
                for name, var in variants.items():  # a fused network's conv1 builds for conv2 too
                    layer = network.layer(name)
                    params, shape = var.resolve_params(run.params[layer.name]), network.variant_shape(layer, var.fuses)
                    request = BuildRequest.of(var.source, var.name, var.defines(params, shape))
                    assert compile_variant(var, params, "sm_90a", shape) is builds[request]


def test_compile_all_keeps_a_compile_error_as_that_builds_result(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void conv_forward(float *y) {\n  y[0] = undefined_name;\n}\n')
    good = BuildRequest.of(KERNELS_DIR / "layers.cu", "layers", {})
    broken = BuildRequest.of(bad, "broken", {"X": 1})
    with compile_all([good, broken, good], "sm_90", workers=2) as pending:
        builds = pending.wait()
        assert set(builds) == {good, broken}
        assert isinstance(builds[broken], CompileError) and "undefined_name" in str(builds[broken])
        bad.write_text("this file is no longer read: the job's builds are")
        with pytest.raises(CompileError, match="undefined_name"):
            compile_source(bad, "broken", {"X": 1}, "sm_90")
        assert compile_source(KERNELS_DIR / "layers.cu", "layers", {}, "sm_90") is builds[good]
    with pytest.raises(CompileError, match="broken.cu"):  # outside the block NVRTC is asked again
        compile_source(bad, "broken", {"X": 1}, "sm_90")


def test_a_ptxas_error_is_the_line_reported():
    """Past the front end (too much shared memory, say) the error is ptxas's, not the log's first line."""
    from convsweep.device.compile import _first_error

    log = ("6: NVRTC_ERROR_COMPILATION, compilation log:\n\nkernels/x.cuh(292): warning #177-D: variable \"y0\" "
           "was declared but never referenced\nptxas info    : Used 32 registers\n ptxas error   : Entry function "
           "'conv_relu_pool_window' uses too much shared data (0xa00000 bytes, 0xc000 max)\n")
    assert _first_error(log, "kernels/x.cu", "x") == (
        "kernels/x.cu: NVRTC failed for variant 'x': ptxas error   : Entry function 'conv_relu_pool_window' uses too "
        "much shared data (0xa00000 bytes, 0xc000 max)")


def test_the_window_kernels_default_register_cap_is_no_cap():
    """MIN_BLOCKS 1 (the default) must leave __launch_bounds__' second argument out: NVRTC allocates
    otherwise with an explicit 1 (conv1 took 106 registers instead of 56, and 0.30 ms instead of 0.26
    on the H100); 5 asks for five blocks per SM. The PTX says which (.minnctapersm)."""
    from cuda.bindings import nvrtc
    from cuda.core import ProgramOptions

    from convsweep.device.compile import _cuda_include_dirs, nvrtc_version
    from convsweep.model.network import load_network
    from convsweep.base.paths import ROOT

    net = load_network(ROOT / "networks/lenet86.yaml")
    var = load_registry()["fp16_sliding_window"]
    defines = var.defines(var.resolve_params({}), net.variant_shape(net.layer("conv1"), var.fuses, 1))
    assert defines["MIN_BLOCKS"] == 1
    source = KERNELS_DIR / var.source

    def ptx(macros: dict) -> str:  # NVRTC itself: cuda.core's PTX path wants a driver
        options = ProgramOptions(arch="compute_90", std="c++17", define_macro=[(k, str(v)) for k, v in macros.items()],
                                 include_path=[str(KERNELS_DIR), *_cuda_include_dirs()],
                                 use_bundled_headers=not _cuda_include_dirs() and nvrtc_version() >= "13.3",
                                 ).as_bytes("nvrtc")
        err, program = nvrtc.nvrtcCreateProgram(source.read_bytes(), b"window.cu", 0, [], [])
        try:
            (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
            err, size = nvrtc.nvrtcGetPTXSize(program)
            text = bytearray(size)  # NVRTC writes into it (never `b" " * size`: see convsweep.device.compile._nvrtc)
            (err,) = nvrtc.nvrtcGetPTX(program, text)
            return text.rstrip(b"\0").decode()
        finally:
            nvrtc.nvrtcDestroyProgram(program)

    assert ".minnctapersm" not in ptx(defines)
    assert ".minnctapersm 5" in ptx({**defines, "MIN_BLOCKS": 5})


def test_every_build_asks_nvrtc_not_to_cache_so_its_ptxas_log_is_read(tmp_path, monkeypatch):
    """NVRTC 12.9+ keeps a cache of its own and hands a cached build back without ptxas' log (NVRTC 13.0 on
    the lent H100 did, from a kernel's second build on): each compile asks for none, so every build's record
    has the registers, shared memory and spills of each kernel."""
    from convsweep.device import compile as compile_module

    log = ("ptxas info    : Compiling entry function 'conv_forward' for 'sm_90'\n"
           "ptxas info    : Function properties for conv_forward\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem")

    def caching_nvrtc(source, name, options, cubin):  # a log only where the cache is off, as NVRTC 13.0's
        assert b"--no-cache" in options.as_bytes("nvrtc")
        return b"\x7fELF cubin", "", log if options.no_cache else ""

    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(compile_module, "_nvrtc", caching_nvrtc)
    build = compile_source(KERNELS_DIR / "naive.cu", "naive", {}, "sm_90")
    assert [(k.name, k.registers, k.shared_bytes, k.spill_store_bytes) for k in build.kernels] == \
        [("conv_forward", 40, 256, 4)]


def test_an_empty_compiler_log_leaves_python_s_one_byte_objects_alone(tmp_path):
    """NVRTC writes its log into the buffer it is handed; an empty log is its NUL alone. Handed `b" " * 1`,
    CPython's one shared b" ", it turned every b" " of the process into b"\\0" (a later /proc scan's
    `replace(b"\\0", b" ")` did nothing, a sealed cache entry never read back)."""
    source = tmp_path / "quiet.cu"
    source.write_text('extern "C" __global__ void quiet(float *y) { y[0] = 1.0f; }\n')
    every_byte = bytes(range(256))
    ptx = compile_ptx(source, "quiet", {}, "sm_90a")
    assert ".entry quiet" in ptx and "\0" not in ptx
    assert [i for i in range(256) if every_byte[i : i + 1][0] != i] == []
