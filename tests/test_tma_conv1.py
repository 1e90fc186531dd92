"""tma_conv1 without a GPU: it builds for sm_90 and sm_90a through the project's NVRTC path with no spills,
its PTX is the design's (one bulk copy on mbarriers, no block barrier in the loop, exactly the loads, mmas
and stores per band the top comment counts; the SASS has UBLKCP and HMMA where a disassembler is installed),
it is refused in one line for targets without the bulk-copy engine, and its layout math
(kernels/tma_conv1.cu's comment), replayed in numpy, computes conv + bias + ReLU + 2x2 max-pool."""
import collections
import math
import re

import numpy as np
import pytest

from kernel_checks import (assert_refused_in_one_line, conv_relu_pool_reference, fresh_conv_inputs,
                           needs_disassembler, replay_error, sass_of)

from convsweep.device.compile import compile_ptx, compile_variant
from convsweep.model.variants import ConvShape, load_registry

NAME = "tma_conv1"
CONV1 = ConvShape(1, 1, 4, 86, 86, 7, 1, 2, 2)  # LeNet-86's conv1 with its 2x2 pool


@pytest.fixture(scope="module")
def variant():
    return load_registry()[NAME]


def geometry(H, W, K, SPLIT_H):
    """The kernel's constexprs (kernels/tma_conv1.cu), from the shape."""
    H_pool, W_pool = (H - K - 1) // 2 + 1, (W - K - 1) // 2 + 1
    tiles, npair = math.ceil(2 * W_pool / 16), (K + 1) // 2
    npr = H_pool // SPLIT_H
    reach = 16 * tiles + 7
    stage = math.ceil((H * W + max(reach - W, 0)) / 32) * 32
    return dict(H_pool=H_pool, W_pool=W_pool, TILES=tiles, NPAIR=npair, NPR=npr, STEPS=npr + npair - 1,
                WARPS=tiles * SPLIT_H, STAGE_FLOATS=stage)


@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
def test_it_builds_for_both_hopper_targets_without_spills(variant, target):
    assert set(variant.arch) == {"sm_90", "sm_90a"} and variant.min_cc == 9.0
    for params in variant.all_combinations():
        build = compile_variant(variant, params, target, CONV1)
        assert build.arch == target and build.cubin[:4] == b"\x7fELF"
        (kernel,) = build.kernels
        assert kernel.name == "conv_relu_pool_tma", build.log
        assert kernel.local_bytes == 0 and kernel.spill_store_bytes == 0, (params, build.log)
        # the persistent grid is resident at once on an H100 (132 SMs): its blocks per SM fit the 64 K registers
        # (allocated per warp in units of 256) and the 228 KB of shared memory (1 KB reserved per block)
        per_sm = math.ceil(params["BLOCKS"] / 132)
        warps = geometry(86, 86, 7, params["SPLIT_H"])["WARPS"] + 1
        assert per_sm * warps * 32 * math.ceil(kernel.registers / 8) * 8 <= 65536, (params, kernel.registers)
        (launch,) = variant.launch_plan(CONV1, params)
        assert per_sm * (launch.shared_bytes + kernel.shared_bytes + 1024) <= 228 * 1024, params


@pytest.mark.parametrize("params", [{"SPLIT_H": 1, "STAGES": 3, "BLOCKS": 264}, {"SPLIT_H": 2, "STAGES": 2, "BLOCKS": 132}])
def test_its_ptx_is_the_design(variant, params):
    """One bulk copy on mbarriers, one block barrier (before the loop), and per band walk exactly: 2 STEPS
    8-byte and 2 STEPS 4-byte shared loads (a row pair each step), NPAIR mmas per pooled row, one store per
    pooled row, 3 max per pooled window; no global load of x and no mma beyond the count."""
    ptx = compile_ptx(variant.source, NAME, variant.defines({**variant.defaults(), **params}, CONV1), "sm_90a")
    assert ".target sm_90a" in ptx
    ops = collections.Counter(re.findall(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.:]*)", ptx, re.M))
    geo = geometry(86, 86, 7, params["SPLIT_H"])
    assert ops["cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"] == 1
    assert ops["mbarrier.arrive.expect_tx.shared::cta.b64"] == 1 and ops["mbarrier.arrive.shared::cta.b64"] == 1
    assert ops["fence.mbarrier_init.release.cluster"] == 1 and "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    assert ops["bar.sync"] == 1  # the ring's barriers order the loop, not __syncthreads
    assert ops["ld.shared.v2.f32"] == 2 * geo["STEPS"] and ops["ld.shared.f32"] == 2 * geo["STEPS"]
    assert ops["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"] == geo["NPR"] * geo["NPAIR"]
    assert ops["st.global.f32"] == geo["NPR"] and ops["max.NaN.f32"] == 3 * geo["NPR"]
    assert ops["cvt.rn.f16x2.f32"] == 4 * geo["STEPS"] + 2 * geo["NPAIR"]  # fragments, then b0, b1 of each B once
    assert ops["ld.global.nc.f32"] == 4 * 4 + 1  # the B fragments' weights and the bias, once per thread
    assert "wgmma" not in ptx and "cp.async.cg" not in ptx


@needs_disassembler
def test_its_sass_has_the_bulk_copy_and_hmma(variant, tmp_path):
    sass = sass_of(variant, CONV1, tmp_path)
    assert "UBLKCP" in sass and "HMMA.16816.F32" in sass and "SYNCS" in sass
    assert " LDL" not in sass and " STL" not in sass  # no local memory


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_100"])
def test_a_target_without_the_bulk_copy_engine_is_refused_in_one_line(variant, target):
    expected = f"variant '{NAME}' needs sm_90 or sm_90a (registry arch), got {target}"
    assert_refused_in_one_line(variant, target, CONV1, expected)


@pytest.mark.parametrize("shape", [CONV1, ConvShape(3, 1, 4, 20, 20, 7, 1, 2, 2), ConvShape(2, 1, 4, 30, 34, 5, 1, 2, 2),
                                   ConvShape(5, 1, 4, 17, 24, 3, 1, 2, 2), ConvShape(1, 1, 4, 86, 130, 7, 1, 2, 2)])
def test_the_launch_plan_matches_the_kernel_geometry(variant, shape):
    """The registry's block and shared_bytes are the kernel's THREADS and SHARED_BYTES for every setting."""
    for params in variant.all_combinations():
        geo = geometry(shape.H, shape.W, shape.K, params["SPLIT_H"])
        if geo["H_pool"] % params["SPLIT_H"]:
            continue
        (launch,) = variant.launch_plan(shape, params)
        assert launch.grid == (min(shape.B, params["BLOCKS"]), 1, 1)
        assert launch.block == (32 * (geo["WARPS"] + 1), 1, 1)
        assert launch.shared_bytes == 4 * params["STAGES"] * geo["STAGE_FLOATS"]
        assert launch.shared_bytes % 128 == 0


@pytest.mark.parametrize("shape, why", [
    (ConvShape(1, 2, 4, 86, 86, 7, 1, 2, 2), "C == 1"),
    (ConvShape(1, 1, 8, 86, 86, 7, 1, 2, 2), "M == 4"),
    (ConvShape(1, 1, 4, 86, 86, 6, 1, 2, 2), "K % 2 == 1"),
    (ConvShape(1, 1, 4, 86, 86, 7, 1, 4, 4), "P == 2"),
    (ConvShape(1, 1, 4, 86, 85, 7, 1, 2, 2), "W % 2 == 0"),
    (ConvShape(1, 1, 4, 87, 86, 7, 1, 2, 2), "H * W % 4 == 0"),
    (ConvShape(1, 1, 4, 88, 86, 7, 1, 2, 2), "H_pool % SPLIT_H == 0"),  # H_pool 41, SPLIT_H 2
])
def test_shapes_outside_its_constraints_are_refused_naming_the_constraint(variant, shape, why):
    from convsweep.base.errors import ShapeError

    with pytest.raises(ShapeError, match=re.escape(why)):
        variant.check_shape(shape, variant.defaults())


# -- the layout math, replayed -------------------------------------------------------------------
# A numpy transliteration of kernels/tma_conv1.cu's indexing (the stage with its zero padding, the lane's
# column e, the A fragment from the fp32 row pair, b_fragment, mma.m16n8k16's fragment layouts from the PTX
# ISA, the rotating accumulator slots, the epilogue and the store offsets): it checks the design's
# arithmetic, not the compiled code (tests/test_tma_conv1_gpu.py does that on the device).
def half(v):
    return np.float64(np.float16(np.float32(v)))  # cvt.rn.f16x2.f32 of one element


def replay(x, w, bias, SPLIT_H):
    """One image x [H, W] through the kernel's index math; y [4, H_pool, W_pool], NaN where unwritten."""
    H, W = x.shape
    K = w.shape[-1]
    geo = geometry(H, W, K, SPLIT_H)
    H_pool, W_pool, TILES, NPAIR, NPR, STEPS = (geo[n] for n in ("H_pool", "W_pool", "TILES", "NPAIR", "NPR", "STEPS"))
    stage = np.zeros(geo["STAGE_FLOATS"], np.float32)  # the image as the bulk copy lays it, zeros after
    stage[:H * W] = x.ravel()
    y = np.full(4 * H_pool * W_pool, np.nan)
    lanes = np.arange(32)
    G, T = lanes // 4, lanes % 4

    def b_fragment(d):  # per lane (b0, b1), each two halves (lower k first)
        frags = []
        for g, t in zip(G, T):
            m, dr = g >> 1, g & 1
            pair = []
            for hf in range(2):
                ky = 2 * d + hf - dr
                pair.append([half(w[m, 0, ky, 2 * t + j]) if 0 <= ky < K and 2 * t + j < K else 0.0 for j in range(2)])
            frags.append(pair)
        return frags

    def b_matrix(frags):  # B 16x8 from the lanes' fragments: b0 (k 2t, 2t+1; n g), b1 (k 2t+8, 2t+9; n g)
        Bm = np.zeros((16, 8))
        for lane, (b0, b1) in enumerate(frags):
            g, t = G[lane], T[lane]
            Bm[2 * t:2 * t + 2, g], Bm[2 * t + 8:2 * t + 10, g] = b0, b1
        return Bm

    Bs = [b_matrix(b_fragment(d)) for d in range(NPAIR)]
    for warp in range(geo["WARPS"]):
        tile, band = warp % TILES, warp // TILES
        e = 16 * tile + 2 * (G + T)
        x_off = 2 * band * NPR * W + e
        y_off = (T * H_pool + band * NPR) * W_pool + 8 * tile + G
        store = 8 * tile + G < W_pool
        slots = [None] * NPAIR  # (pooled row, accumulator [lane][4]) per slot
        for p in range(STEPS):
            r0 = x_off + 2 * p * W
            r1 = r0 + W
            assert r1.max() + 2 < len(stage), "a read past the stage"
            regs = [(stage[r0], stage[r0 + 1]), (stage[r0 + 1], stage[r0 + 2]),  # a0, a1 (row 2p)
                    (stage[r1], stage[r1 + 1]), (stage[r1 + 1], stage[r1 + 2])]  # a2, a3 (row 2p + 1)
            A = np.zeros((16, 16))
            for i, (lo, hi) in enumerate(regs):  # a_i: row g (+8 for odd i), k 2t, 2t+1 (+8 for i >= 2)
                rows, ks = G + 8 * (i % 2), 2 * T + 8 * (i // 2)
                A[rows, ks] = [half(v) for v in lo]
                A[rows, ks + 1] = [half(v) for v in hi]
            for d in range(NPAIR):
                j = p - d
                if j < 0 or j >= NPR:
                    continue
                D = A @ Bs[d]
                frag = np.stack([D[G, 2 * T], D[G, 2 * T + 1], D[G + 8, 2 * T], D[G + 8, 2 * T + 1]], axis=1)
                if d == 0:  # mma_first: the slot starts over
                    assert slots[j % NPAIR] is None or slots[j % NPAIR][0] == j - NPAIR, "slot still in use"
                    slots[j % NPAIR] = (j, frag)
                else:
                    assert slots[j % NPAIR][0] == j, "slot holds another pooled row"
                    slots[j % NPAIR] = (j, slots[j % NPAIR][1] + frag)
            j = p - (NPAIR - 1)
            if j < 0:
                continue
            held, acc = slots[j % NPAIR]
            assert held == j
            s = acc.max(axis=1) + bias[T]
            for lane in np.flatnonzero(store):
                index = y_off[lane] + j * W_pool
                assert np.isnan(y[index]), "written twice"
                y[index] = max(s[lane], 0.0)
    return y.reshape(4, H_pool, W_pool)


@pytest.mark.parametrize("H, W, K, SPLIT_H", [
    (86, 86, 7, 1),   # LeNet-86's conv1: 5 tiles, the last one reading past its rows
    (86, 86, 7, 2),   # two bands of 20 pooled rows
    (20, 20, 7, 1),   # one tile, half of it pooled away, reads past the image into the padding
    (30, 34, 5, 1),   # K 5: three pairs a pooled row
    (17, 24, 3, 1),   # K 3, odd H: the last input row is never read
    (28, 86, 1, 2),   # K 1: one pair a pooled row
    (26, 130, 7, 2),  # 8 tiles, H_pool 10 in two bands
])
def test_the_layout_math_computes_conv_relu_pool(H, W, K, SPLIT_H):
    var = load_registry()[NAME]
    var.check_shape(ConvShape(1, 1, 4, H, W, K, 1, 2, 2), {**var.defaults(), "SPLIT_H": SPLIT_H})  # a shape it takes
    x, w, b = fresh_conv_inputs(1, 4, H, W, K)
    y = replay(x[0, 0], w, b, SPLIT_H)
    assert replay_error(y, conv_relu_pool_reference(x, w, b, 2)[0]) <= var.tolerance


def test_the_reads_past_a_row_meet_only_zero_weights():
    """The elements the last tile reads past column W - 1 (the next row's first, or the padding) change
    nothing: the replay with them made huge gives the same pooled maps."""
    x, w, b = fresh_conv_inputs(1, 4, 86, 86, 7)
    x = x[0, 0]
    spiked = x.copy()
    spiked[:, :2] = 3e4  # what a read past the previous row sees (columns 0 and 1 of the next row)
    base, spiked_y = replay(x, w, b, 1), replay(spiked, w, b, 1)
    assert replay_error(spiked_y, conv_relu_pool_reference(spiked[None, None], w, b, 2)[0]) <= 1e-2
    assert np.array_equal(base[:, :, 1:], spiked_y[:, :, 1:])  # columns whose windows miss columns 0, 1
