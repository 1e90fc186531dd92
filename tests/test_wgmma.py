"""wgmma_conv2 without a GPU: it builds for sm_90a through the project's NVRTC path, asks for wgmma in its
PTX (HGMMA in its SASS where a disassembler is installed), is refused in one line for targets without
wgmma, and its layout math (kernels/wgmma_conv2.cu's comment), replayed in numpy, computes the conv."""
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from kernel_checks import (assert_refused_in_one_line, conv_relu_pool_reference, fresh_conv_inputs,
                           needs_disassembler, replay_error, sass_of)

from convsweep.device.compile import compile_ptx, compile_variant
from convsweep.base.errors import ConfigError
from convsweep.base.fileio import canonical_hash
from convsweep.model.variants import ConvShape, load_registry

NAME = "wgmma_conv2"
CONV2 = ConvShape(1, 4, 16, 40, 40, 7, 1, 4, 4)  # LeNet-86's conv2 with its 4x4 pool


@pytest.fixture(scope="module")
def variant():
    return load_registry()[NAME]


def test_it_builds_for_sm_90a_the_target_auto_gives_an_h100(variant):
    """auto on an H100 resolves to sm_90a (provenance.own_arch), as it does where there is no GPU to ask."""
    from convsweep.device.provenance import NO_GPU_ARCH, own_arch

    assert variant.arch == ("sm_90a",) and variant.min_cc == 9.0
    assert own_arch(9, 0) == NO_GPU_ARCH == "sm_90a" and own_arch(8, 0) == "sm_80"
    build = compile_variant(variant, variant.defaults(), "sm_90a", CONV2)
    assert build.arch == "sm_90a" and build.cubin[:4] == b"\x7fELF"
    (kernel,) = build.kernels
    assert kernel.name == "conv_relu_pool_wgmma" and kernel.local_bytes == 0, build.log


def test_every_setting_builds_without_spills_or_serialized_wgmma(variant):
    """ptxas says C7510 'wgmma.mma_async instructions are serialized' where it must wait after every wgmma."""
    for params in variant.all_combinations():
        build = compile_variant(variant, params, "sm_90a", CONV2)
        assert build.kernels[0].spill_store_bytes == 0 and build.kernels[0].spill_load_bytes == 0, params
        assert "serialized" not in build.log, build.log


def test_its_ptx_asks_for_wgmma_with_the_fences_hopper_needs(variant):
    ptx = compile_ptx(variant.source, NAME, variant.defines(variant.defaults(), CONV2), "sm_90a")
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16" in ptx
    for instruction in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                        "fence.proxy.async.shared::cta", "cp.async.cg.shared.global"):
        assert instruction in ptx, instruction
    assert "mma.sync" not in ptx  # no fallback onto the older path


@needs_disassembler
def test_its_sass_is_hgmma(variant, tmp_path):
    sass = sass_of(variant, CONV2, tmp_path)
    assert "HGMMA.64x16x16.F32" in sass
    assert " HMMA" not in sass  # a matrix kernel showing only HMMA is on the slower path (HOPPER.md)


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
def test_a_target_without_wgmma_is_refused_in_one_line_naming_the_variant(variant, target):
    assert_refused_in_one_line(variant, target, CONV2, f"variant '{NAME}' needs sm_90a (registry arch), got {target}")


def test_the_other_variants_keep_their_targets_and_entry_hashes():
    """`arch` absent is (): any target, and the entry hashes as it did before the key existed (its jobs are
    not re-measured); a listed arch is part of the hash."""
    registry = load_registry()
    assert NAME in [name for name, var in registry.items() if var.arch]
    for name, var in registry.items():
        if var.is_cpu or var.arch:
            continue
        assert var.build_arch("sm_80") == "sm_80" and var.build_arch("sm_90") == "sm_90"
        entry = dataclasses.asdict(var)  # the hash as Variant.entry_hash made it before `arch`
        for key in ("description", "unit", "arch"):
            entry.pop(key)
        for key in ("absorbs_input", "prepare"):  # keys that came later: an entry without them hashes as before
            if not entry[key]:
                entry.pop(key)
        entry["source"] = Path(entry["source"]).name
        assert var.entry_hash == canonical_hash(entry)[:16], name
    naive = registry["naive"]
    assert dataclasses.replace(naive, arch=("sm_90a",)).entry_hash != naive.entry_hash
    prepare = {"bytes": "64", "launches": [{"kernel": "naive", "grid": [1], "block": [1]}]}
    assert dataclasses.replace(naive, prepare=prepare).entry_hash != naive.entry_hash


@pytest.mark.parametrize("value, expected", [
    ("[sm_90a, sm_90a]", "a.arch: expected no repeated items"),
    ("[sm90a]", "a.arch[0]: expected an NVRTC target such as sm_90a, got \"sm90a\""),
    ("sm_90a", "a.arch: expected array"),
])
def test_a_bad_arch_in_a_registry_is_one_line_naming_the_key(tmp_path, value, expected):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "x.cu").write_text("")
    path = kernels / "variants.yaml"
    path.write_text(f"a: {{precision: fp16, source: x.cu, launches: [{{kernel: k, grid: [1], block: [1]}}], arch: {value}}}")
    with pytest.raises(ConfigError) as info:
        load_registry(path)
    assert str(info.value).split("kernels/", 1)[1].startswith(f"variants.yaml:1: {expected}"), str(info.value)


# -- the layout math, replayed -------------------------------------------------------------------
# A numpy transliteration of kernels/wgmma_conv2.cu's indexing (staging, B core matrices and descriptor,
# A fragments, the accumulator layout, the epilogue) driven by the PTX ISA's fragment layouts: it checks
# the design's arithmetic, not the compiled code (tests/test_wgmma_gpu.py does that on the device).
LBO, SBO = 128, 256


def replay(x, w, bias, P, PR, WG):
    """One image x [C, H, W] through the kernel's index math; y [M, H_pool, W_pool], NaN where unwritten."""
    C, H, W = x.shape
    M, K = w.shape[0], w.shape[2]
    H_pool, W_pool = (H - K + 1 - P) // P + 1, (W - K + 1 - P) // P + 1
    TILES = math.ceil(W_pool * P / 16)
    SLOTS, Q = 4 // TILES, PR * P
    R, BANDS = Q + K - 1, math.ceil(H_pool / PR)
    PASSES, PW = math.ceil(BANDS / SLOTS), max(W, 16 * TILES + 8)
    xs = np.zeros((C * H, PW), np.float32)  # staged rows, zero past W
    xs[:, :W] = x.reshape(C * H, W)
    xs = xs.ravel()
    tile_bytes = 16 * M * 2
    b_s = np.zeros(C // 2 * K * tile_bytes // 2, np.float16)  # the B tiles, as halves
    for f in range(C // 2 * K):
        for n in range(M):
            for kk in range(16):
                c, d, kx = 2 * (f // K) + kk // 8, f % K, kk % 8
                offset = f * tile_bytes + (kk // 8) * LBO + (n // 8) * SBO + (n % 8) * 16 + (kk % 8) * 2
                b_s[offset // 2] = w[n, c, d, kx] if kx < K else 0.0

    def b_tile(f):  # what the descriptor (start f * 512, LBO, SBO, no swizzle) makes the tensor cores read
        return np.array([[b_s[(f * tile_bytes + (k // 8) * LBO + (n // 8) * SBO + (n % 8) * 16 + (k % 8) * 2) // 2]
                          for n in range(M)] for k in range(16)], np.float64)

    y = np.full((M, H_pool, W_pool), np.nan, np.float32)
    lanes = np.arange(32)
    g, t = lanes // 4, lanes % 4
    for wg in range(WG):
        for p in range(wg, PASSES, WG):
            acc = np.zeros((Q, 4, 32, 8))  # [conv row][warp][lane][d register]
            for cp in range(C // 2):
                for r in range(R):
                    A = np.zeros((64, 16))
                    for wq in range(4):
                        tile, slot = wq % TILES, wq // TILES
                        row = min((p * SLOTS + slot) * Q + r, H - 1)
                        src0 = (2 * cp * H + row) * PW + 16 * tile + 2 * (g + t)
                        src1 = src0 + H * PW
                        def half(i):
                            return xs[i].astype(np.float16).astype(np.float64)  # cvt.rn.f16x2.f32

                        regs = [(half(src0), half(src0 + 1)), (half(src0 + 1), half(src0 + 2)),
                                (half(src1), half(src1 + 1)), (half(src1 + 1), half(src1 + 2))]
                        for i, (lo, hi) in enumerate(regs):  # a_i: row g (+8 for odd i), k 2t (+8 for i >= 2)
                            rows, ks = 16 * wq + g + 8 * (i % 2), 2 * t + 8 * (i // 2)
                            A[rows, ks], A[rows, ks + 1] = lo, hi
                    for q in range(Q):
                        d = r - q
                        if 0 <= d < K:
                            D = A @ b_tile(cp * K + d)
                            for j in range(8):  # d_j: row g (+8 for j % 4 >= 2), column 8 (j // 4) + 2t + j % 2
                                for wq in range(4):
                                    acc[q, wq, :, j] += D[16 * wq + g + 8 * ((j // 2) % 2), 8 * (j // 4) + 2 * t + j % 2]
            for wq in range(4):
                tile, slot = wq % TILES, wq // TILES
                band = p * SLOTS + slot
                for pr in range(PR):
                    v = acc[pr * P:(pr + 1) * P, wq].max(axis=0)  # [lane][8]
                    h = np.stack([np.maximum(v[:, 0], v[:, 2]), np.maximum(v[:, 1], v[:, 3]),
                                  np.maximum(v[:, 4], v[:, 6]), np.maximum(v[:, 5], v[:, 7])], axis=1)
                    if P == 4:
                        h = np.maximum(h, h[lanes ^ 4])  # __shfl_xor_sync(..., 4)
                    for lane in range(32):
                        ph, pc = band * PR + pr, (16 * tile + 2 * g[lane]) // P
                        if ph >= H_pool or pc >= W_pool or (P == 4 and g[lane] % 2):
                            continue
                        for j in range(4):
                            m = (j // 2) * 8 + 2 * t[lane] + j % 2
                            assert np.isnan(y[m, ph, pc]), "written twice"
                            y[m, ph, pc] = max(h[lane, j] + bias[m], 0.0)
    return y


@pytest.mark.parametrize("C, H, W, K, P, PR, WG", [
    (4, 40, 40, 7, 4, 1, 2),   # LeNet-86's conv2, the registry defaults
    (4, 40, 40, 7, 4, 2, 1),
    (2, 25, 24, 5, 2, 1, 2),   # padded rows (PW 40 > W), 10 pooled rows over 5 passes: a last partial one
    (6, 19, 20, 5, 2, 2, 2),   # one 16-pixel tile per warp: 4 bands side by side
    (2, 40, 68, 5, 2, 1, 1),   # four tiles: one band per wgmma
])
def test_the_layout_math_computes_conv_relu_pool(C, H, W, K, P, PR, WG):
    var = load_registry()[NAME]
    shape = ConvShape(1, C, 16, H, W, K, 1, P, P)
    var.check_shape(shape, {**var.defaults(), "PR": PR, "WG": WG})  # inside the registry constraints
    x, w, b = fresh_conv_inputs(C, 16, H, W, K)
    y = replay(x[0], w, b, P, PR, WG)
    assert replay_error(y, conv_relu_pool_reference(x, w, b, P)[0]) <= var.tolerance
