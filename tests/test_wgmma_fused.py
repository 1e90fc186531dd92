"""wgmma_fused_network without a GPU: its two kernels (prepare_weights, network_forward) build for sm_90a
through the project's NVRTC path (every setting, no spills, 2 blocks per SM, no serialized wgmma: on an older
NVRTC only the registry default must be free of them, the others are xfailed naming the NVRTC), it asks for
wgmma at N 32 only, the fences and the bulk copy in its PTX (HGMMA in its SASS where a disassembler is
installed) with the B descriptors built before the image loop and 16 mma.sync in the dense phase, is refused
in one line for sm_80 and plain sm_90, its registry prepare (prepare_weights, once per binding of the
weights: fc1's fragments, then the B tiles) and launch (network_forward) are the kernel's layout, and its
layout math (kernels/wgmma_fused_network.cu's comment: the prepared buffer, pixel pairs as A rows, (conv row,
map, pixel) as N, B blocks in decreasing kernel row, conv1's slots as vertical strips over padded maps, fc1's
weights as mma fragments, the dense tail's partial sums and shuffles), replayed in numpy, computes LeNet-86's
logits."""
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest

from kernel_checks import assert_refused_in_one_line, needs_disassembler, sass_of

from convsweep.model.checks import normwise_error
from convsweep.device.compile import compile_ptx, compile_variant, nvrtc_version
from convsweep.base.errors import ShapeError
from convsweep.model.network import load_network, load_weights
from convsweep.base.paths import ROOT
from convsweep.model.reference import conv2d_reference, maxpool2d_reference
from convsweep.model.variants import load_registry

NAME = "wgmma_fused_network"
LENET = load_network(ROOT / "networks/lenet86.yaml")


@pytest.fixture(scope="module")
def variant():
    return load_registry()[NAME]


def network_of_size(tmp_path, size: int):
    """LeNet-86's layers on a size x size input (a network file of its own; its weights are the test's)."""
    text = (ROOT / "networks/lenet86.yaml").read_text().replace("input: [1, 86, 86]", f"input: [1, {size}, {size}]")
    path = tmp_path / f"lenet{size}.yaml"
    path.write_text(text.replace("weights: ../data/lenet86-weights.npz", "weights: none.npz"))
    return load_network(path)


def fused_shape(network, batch: int = 1):
    return network.variant_shape(network.layer("conv1"), load_registry()[NAME].fuses, batch)


SCHEDULE = ("C2R",)  # what changes the code (BLOCKS is the grid only)


def is_default(variant, params) -> bool:
    return all(params[k] == variant.defaults()[k] for k in SCHEDULE)


def nvrtc_tuple() -> tuple[int, ...]:
    return tuple(int(part) for part in nvrtc_version().split("."))


@pytest.mark.parametrize("params", load_registry()[NAME].all_combinations(),
                         ids=lambda p: "-".join(f"{k}{v}" for k, v in sorted(p.items())))
def test_every_setting_builds_for_sm_90a_at_two_blocks_per_sm_without_spills_or_serialized_wgmma(variant, params):
    """ptxas says C7510-C7518 'wgmma.mma_async instructions are serialized' where it must wait after each
    wgmma (seen here while conv2's wgmma took accumulator runs that overlapped without being equal; with
    round two's conv1 M-block pairs while their loop's trip count depended on the warpgroup, C7518, or the
    store was a branch), and C7517 'wgmma.wait_group is injected' where it adds a wait (seen while one
    accumulator set was zeroed with the other's group in flight; the first wgmma now has scale-d false). The
    lent H100's NVRTC (13.0) serialized a round-two setting where this machine's 13.5 did not: on an NVRTC
    older than 13.5 the registry default must still be free of it (it is what runs), another setting that
    is not is an xfail that names the NVRTC and ptxas' line (pytest -rx prints it), not a skip."""
    assert variant.arch == ("sm_90a",) and variant.min_cc == 9.0 and not variant.absorbs_input
    build = compile_variant(variant, params, "sm_90a", fused_shape(LENET))
    assert build.arch == "sm_90a" and build.cubin[:4] == b"\x7fELF"
    kernels = {k.name: k for k in build.kernels}  # NVRTC's order is not the launch order
    assert sorted(kernels) == ["network_forward", "prepare_weights"], params
    kernel = kernels["network_forward"]
    # No spills; a small stack frame (local_bytes) may depend on the NVRTC release.
    assert kernel.spill_store_bytes == 0 and kernel.spill_load_bytes == 0, (params, build.log)
    assert kernel.registers <= 128, (params, kernel.registers)  # 2 blocks of 256 threads per SM
    serialized = [line for line in build.log.splitlines() if "serialized" in line or "injected" in line]  # C7510-C7518, C7517
    if serialized and not is_default(variant, params) and nvrtc_tuple() < (13, 5):
        pytest.xfail(f"NVRTC {nvrtc_version()} serializes {params}: {serialized[0].strip()}")
    assert not serialized, f"NVRTC {nvrtc_version()}, {params}: {serialized}"


def test_its_ptx_asks_for_wgmma_with_the_fences_hopper_needs(variant):
    ptx = compile_ptx(variant.source, NAME, variant.defines(variant.defaults(), fused_shape(LENET)), "sm_90a")
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in ptx  # conv1 and conv2
    assert "m64n16k16" not in ptx  # conv1's strips are N 32 only (round three's C1N 16 is gone)
    for instruction in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                        "mbarrier.try_wait.parity.shared::cta.b64"):
        assert instruction in ptx, instruction
    # Bulk copies: the B tiles and the first image in the prologue, the next image in the loop; the image is
    # one copy, not 16-byte chunks. The tiles are written and read by the async proxy alone (the copy, wgmma):
    # no proxy fence is left (round four's tiles were ordinary stores, fenced).
    assert ptx.count("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes") == 3
    assert "cp.async.cg" not in ptx and "fence.proxy.async" not in ptx
    # The B descriptors are built once, before the image loop: every wgmma's descriptor register is
    # defined before the first wgmma (no address arithmetic rebuilds one inside the loops).
    first_wgmma = ptx.index("wgmma.mma_async")
    for desc in set(re.findall(r"wgmma\.mma_async[^;]*\}, (%rd\d+), p,", ptx)):
        defines = re.compile(rf"^\s*[a-z][\w.]*\s+{re.escape(desc)},", re.M)  # its first operand: written
        assert defines.search(ptx[:first_wgmma]), desc
        assert not defines.search(ptx[first_wgmma:]), f"{desc} rebuilt in the loops"
    # mma.sync is left only in fc1 (1% of the work): m16n8k16 over 8 images, dense_fragments fully unrolled,
    # so each warp's 8 k-steps (1024 features / 8 warps / 16) x 2 m-tiles appear once each: 16.
    assert ptx.count("mma.sync.aligned") == ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 16


@needs_disassembler
def test_its_sass_is_hgmma(variant, tmp_path):
    assert "HGMMA.64x32x16.F32" in sass_of(variant, fused_shape(LENET), tmp_path)


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
def test_a_target_without_wgmma_is_refused_in_one_line_naming_the_variant(variant, target):
    assert_refused_in_one_line(variant, target, fused_shape(LENET), f"variant '{NAME}' needs sm_90a (registry arch), got {target}")


# -- the layout math, replayed -------------------------------------------------------------------
# A numpy transliteration of kernels/wgmma_fused_network.cu's indexing (staging, B blocks and descriptors,
# A fragments, accumulator layouts, the epilogues' pools and shuffle, fc1's weight fragments), driven by the
# PTX ISA's fragment layouts: it checks the design's arithmetic, not the compiled code
# (tests/test_wgmma_fused_gpu.py does).
LBO, SBO = 128, 256
LANES = np.arange(32)
G, T = LANES // 4, LANES % 4


@dataclass(frozen=True)
class Layout:
    """The kernel's constants for an H x W input (its constexprs, in the same words)."""

    H: int
    W: int

    def __post_init__(self):
        d = object.__setattr__
        d(self, "HP1", (self.H - 6) // 2)
        d(self, "WP1", (self.W - 6) // 2)
        d(self, "HP2", (self.HP1 - 10) // 4 + 1)
        d(self, "WP2", (self.WP1 - 10) // 4 + 1)
        d(self, "FEAT", 16 * self.HP2 * self.WP2)
        d(self, "RG", (self.HP1 + 1) // 2)
        d(self, "UPR", (self.WP1 + 7) // 8)
        d(self, "SPC", min(16 // self.UPR, self.RG))
        d(self, "STEPS1", (self.RG + self.SPC - 1) // self.SPC)
        d(self, "PW1", max(self.W, 16 * self.UPR + 6))
        d(self, "UNEVEN", self.UPR == 5 and 3 * self.STEPS1 - 1 >= self.RG and 4 * (self.STEPS1 - 1) >= self.RG)
        d(self, "HR1", max(self.H, 4 * (self.RG + 2 * self.SPC) + 6))
        d(self, "PW2", max(38, 8 * self.UPR))
        d(self, "HR2", max(38, 2 * (self.RG + 2 * self.SPC)))
        d(self, "CH2", (self.HR2 * self.PW2 + 63) // 64 * 64 + 16)

    def shared_bytes(self) -> int:
        x1 = (2 * self.HR1 * self.PW1 + 15) // 16 * 16
        return 5 * 1024 + 2 * 7 * 1024 + 4 * self.H * self.W + x1 + 2 * 4 * self.CH2 + 2 * 8 * (self.FEAT + 8)

    def steps(self, v: int) -> int:
        """conv1's steps in warpgroup v: one fewer in warpgroup 1 where the strips are UNEVEN."""
        return self.STEPS1 - 1 if self.UNEVEN and v == 1 else self.STEPS1

    def slot(self, j: int) -> tuple[int, int, int]:
        """conv1's slot j (= 8 v + 2 w + hi): its strip's (ld, st, step) in halves from x1's and x2's starts,
        lane offsets left out (the kernel's `slot` is in bytes, the same x 2), one rowgroup a step from rg0.
        UNEVEN: j < 8 strip j % 2 of block column j // 2 (rg0 STEPS1 (j % 2)), j < 12 strip 2 of column j - 8
        (rg0 2 STEPS1), else strip j - 12 of column 4 (rg0 (STEPS1 - 1) (j - 12)). Otherwise strip j % SPC of
        block column blk = j // SPC, rg0 = STEPS1 (j % SPC), and slots j >= UPR SPC are idle: they read from
        x1's origin and store into x2 rows 2 SPC STEPS1, + 1 (past every strip's) at every step."""
        if self.UNEVEN:
            blk = j // 2 if j < 8 else j - 8 if j < 12 else 4
            rg0, used = (j % 2 * self.STEPS1 if j < 8 else 2 * self.STEPS1 if j < 12 else (j - 12) * (self.STEPS1 - 1)), True
        else:
            blk, rg0, used = j // self.SPC, j % self.SPC * self.STEPS1, j < self.UPR * self.SPC
        ld = 4 * rg0 * self.PW1 + 16 * blk if used else 0
        st = 2 * rg0 * self.PW2 + 8 * blk if used else 2 * self.SPC * self.STEPS1 * self.PW2
        return ld, st, 2 * self.PW2 if used else 0


def b_offset(k, n):
    return (n // 8) * SBO + (k // 8) * LBO + (n % 8) * 16 + (k % 8) * 2


def b_read(mem, start, n_cols):
    """B [16 x n_cols] as the tensor cores read it through a descriptor at byte `start` (LBO, SBO, no swizzle)."""
    k, n = np.meshgrid(np.arange(16), np.arange(n_cols), indexing="ij")
    return mem[(start + b_offset(k, n)) // 2].astype(np.float64)


def d_place(i):
    """Register i of an m64nNk16 accumulator: (row within the warp's 16 for lanes G, column for lanes T)."""
    return G + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * T + i % 2


TILE_BYTES = (5 + 2 * 7) * 1024  # conv1's 5 blocks (row pairs), conv2's 2 x 7 (channel pair, kernel row)


def b_tiles(w1, w2) -> np.ndarray:
    """The B tiles as prepare_weights writes them after fc1's fragments (and the prologue's bulk copy puts
    them at shared memory's start): a thread per core-matrix row r (block r // 64, column (r // 2) % 32,
    k half r % 2), 8 halves at block * 1024 + b_offset(8 kh, n); [TILE_BYTES / 2] halves."""
    tiles, written = np.full(TILE_BYTES // 2, np.nan, np.float16), np.zeros(TILE_BYTES // 2, int)
    for r in range(TILE_BYTES // 16):
        blk, n, kh = r // 64, (r // 2) % 32, r % 2
        for kp in range(8):
            if blk < 5:  # conv1: [f][n = 8 dr + 2 m + s][k = 8 pp + k'] = w1[m][2 f + pp - dr][k' - s]
                ky, kx, m = 2 * blk + kh - n // 8, kp - n % 2, (n % 8) // 2
                value = w1[m, 0, ky, kx] if 0 <= ky < 7 and 0 <= kx < 7 else 0.0
            else:  # conv2: [cp][6 - d][n = 2 m + s][k = 8 cc + k'] = w2[m][2 cp + cc][d][k' - s]
                cp, d = (blk - 5) // 7, 6 - (blk - 5) % 7
                kx, m = kp - n % 2, n // 2
                value = w2[m, 2 * cp + kh, d, kx] if 0 <= kx < 7 else 0.0
            at = (blk * 1024 + b_offset(8 * kh + kp, n)) // 2
            tiles[at] = np.float32(value).astype(np.float16)
            written[at] += 1
    assert (written == 1).all(), "every half of the tiles written once"
    return tiles


def prepared_buffer(wt) -> np.ndarray:
    """The registry prepare's buffer, as halves: fc1's fragments (64 FEAT bytes), then the B tiles."""
    return np.concatenate([fc1_fragments(wt["fc1.weight"]).ravel(), b_tiles(wt["conv1.weight"], wt["conv2.weight"])])


def replay_image(x, tiles, b1, b2, lay: Layout, c2r: int = 1) -> np.ndarray:
    """One image x [H, W] through conv1 and conv2 as the kernel indexes them, its B tiles `tiles` (b_tiles);
    its fp16 features [16 * HP2 * WP2]."""
    H, W = lay.H, lay.W
    def f16(a):
        return np.asarray(a, np.float32).astype(np.float16)

    b1s, b2s = tiles[:5 * 512], tiles[5 * 512:]  # B1 at shared byte 0, B2 at OFF_B2 = 5 KB
    # stage_input: x1 [HR1][PW1], zero past W and below H (zeroed once); x2 zeroed once.
    x1 = np.zeros((lay.HR1, lay.PW1), np.float16)
    x1[:H, :W] = f16(x)
    x1 = x1.ravel()
    x2 = np.zeros(4 * lay.CH2, np.float16)
    written = np.zeros(4 * lay.CH2, int)
    writer = np.full(4 * lay.CH2, -1)  # the warp (4 v + w) that stored an element: no two warps store into one
    # stores stay in their map (checked at each store below): every block's columns
    assert lay.PW2 >= 8 * lay.UPR
    assert lay.HR2 * lay.PW2 <= lay.CH2

    # conv1: warpgroup v steps its 8 slots down their strips (warp w: rows g slot 8 v + 2 w, rows g + 8 slot
    # 8 v + 2 w + 1), lay.steps(v) steps of 5 wgmma (row pairs f) on the strips' row pairs 2 i + f, each pair loaded
    # once into the kernel's P[p]: pairs 0..4 before step 0, 2 i + 5 and 2 i + 6 after step i's wait.
    for v in range(2):
        steps = lay.steps(v)
        NP = 2 * steps + 3  # the kernel's P[2 STEPS + 3][4]
        slots = [[lay.slot(8 * v + 2 * w + hi) for hi in range(2)] for w in range(4)]  # [w][lo, hi]: (ld, st, step)
        P = np.full((NP, 4, 4, 32, 2), np.nan)  # [p][warp][register][lane][half of the f16x2]

        def load(p):
            assert 0 <= p < NP and np.isnan(P[p]).all(), f"row pair {p} loaded twice or past P"
            for w in range(4):
                ld_lo, ld_hi = (slots[w][hi][0] + 2 * (G + T) for hi in range(2))  # this lane's (pair g, k' 2t)
                # [0] lo's row 2p, [1] hi's, [2] lo's 2p + 1, [3] hi's: no clamp, immediates from two pointers
                for reg, addr in enumerate([ld_lo + 2 * p * lay.PW1, ld_hi + 2 * p * lay.PW1,
                                            ld_lo + (2 * p + 1) * lay.PW1, ld_hi + (2 * p + 1) * lay.PW1]):
                    assert (addr % 2 == 0).all() and addr.max() + 1 < len(x1)  # aligned 32-bit loads inside x1's rows
                    P[p, w, reg] = np.stack([x1[addr], x1[addr + 1]], axis=1)

        for p in range(5):
            load(p)
        for i in range(steps):
            D = np.zeros((64, 32))  # [warp x 16 + row][column]
            for f in range(5):
                A = np.zeros((4, 16, 16))  # [warp][row][k]
                for reg, (row_off, k_off) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):  # mma.m16n8k16's A
                    for e in range(2):
                        A[:, G + row_off, 2 * T + k_off + e] = P[2 * i + f, :, reg, :, e]
                assert not np.isnan(A).any(), f"step {i} reads row pair {2 * i + f} before it is loaded"
                D += A.reshape(64, 16) @ b_read(b1s, f * 1024, 32)
            if i + 1 < steps:  # the next step's two new row pairs
                load(2 * i + 5), load(2 * i + 6)
            for w in range(4):
                acc = np.zeros((2, 8, 32))  # acc[h][i] per lane: register 8h + i of m64n32
                for h in range(2):
                    for r in range(8):
                        rows, cols = d_place(8 * h + r)
                        acc[h, r] = D[16 * w + rows, cols]
                (_, st_lo, step_lo), (_, st_hi, step_hi) = slots[w]
                for h in range(2):
                    for half in range(2):
                        m4 = np.maximum(np.maximum(acc[h, 2 * half], acc[h, 2 * half + 1]),
                                        np.maximum(acc[h, 4 + 2 * half], acc[h, 5 + 2 * half]))
                        # every lane stores (no predicate): map t, (pooled row 2 rg + h, column 8 blk + g)
                        at = (st_hi + i * step_hi if half else st_lo + i * step_lo) + T * lay.CH2 + G + h * lay.PW2
                        assert (0 <= at - T * lay.CH2).all() and (at - T * lay.CH2 < lay.HR2 * lay.PW2).all(), (v, w, i)
                        x2[at] = f16(np.maximum(m4 + b1[T], 0.0))
                        np.add.at(written, at, 1)
                        assert np.isin(writer[at], (-1, 4 * v + w)).all(), f"warps race on x2 (warp {4 * v + w}, step {i})"
                        writer[at] = 4 * v + w
    maps = written.reshape(4, lay.CH2)[:, :lay.HR2 * lay.PW2].reshape(4, lay.HR2, lay.PW2)
    assert (maps[:, :lay.HP1, :lay.WP1] == 1).all(), "each pooled conv1 value written once"
    assert written.reshape(4, lay.CH2)[:, lay.HR2 * lay.PW2:].sum() == 0, "nothing past a map's rows"
    # the rest (columns >= WP1, rows >= HP1: the strips' steps past RG, the idle slots, blocks past the maps)
    # is read only by conv2 outputs that are not stored (4 HP2 + 5 <= HP1 - 1, the same for columns)
    assert 4 * lay.HP2 + 5 <= lay.HP1 - 1 and 4 * lay.WP2 + 6 <= lay.WP1

    # conv2
    feat = np.full(16 * lay.HP2 * lay.WP2, np.nan, np.float32)
    for v in range(2):
        D = np.zeros((4, 4, 16, 32))  # [q][warp][row][column]
        for cp in range(2):
            for r in [r0 + i for r0 in range(0, 10, c2r) for i in range(c2r)]:  # C2R rows per commit group
                A = np.zeros((4, 16, 16))
                for w in range(4):
                    band = 4 * v + w
                    row = 4 * band + r  # no clamp: x2 has HR2 >= 38 rows
                    p0 = 2 * (2 * G + T) + 2 * cp * lay.CH2 + row * lay.PW2  # A row g: pixel pair 2g; row g + 8: 2g + 1
                    for (addr, row_off, k_off) in [(p0, 0, 0), (p0 + 2, 8, 0), (p0 + lay.CH2, 0, 8), (p0 + lay.CH2 + 2, 8, 8)]:
                        assert (addr % 2 == 0).all() and (addr % lay.CH2).max() + 1 < lay.PW2 * lay.HR2
                        A[w, G + row_off, 2 * T + k_off] = x2[addr]
                        A[w, G + row_off, 2 * T + k_off + 1] = x2[addr + 1]
                for q in range(4):
                    d = r - q
                    if 0 <= d < 7:
                        D[q].reshape(64, 32)[:] += A.reshape(64, 16) @ b_read(b2s, (cp * 7 + 6 - d) * 1024, 32)
        for w in range(4):
            band = 4 * v + w
            acc = np.zeros((4, 2, 8, 32))
            for q in range(4):
                for h in range(2):
                    for i in range(8):
                        rows, cols = d_place(8 * h + i)
                        acc[q, h, i] = D[q, w, rows, cols]
            for h in range(2):
                for i in range(2):
                    m = 4 * (2 * h + i) + T
                    # registers 4i .. 4i + 3: pixels 4g .. 4g + 3 (pairs 2g, 2g + 1) of the 4 conv rows: the pool
                    # of pooled column g, in the thread
                    xm = np.max([acc[q, h, 4 * i + e] for q in range(4) for e in range(4)], axis=0)
                    for lane in LANES:
                        if band >= lay.HP2 or G[lane] >= lay.WP2:
                            continue
                        at = (m[lane] * lay.HP2 + band) * lay.WP2 + G[lane]
                        assert np.isnan(feat[at]), "written twice"
                        feat[at] = f16(max(xm[lane] + b2[m[lane]], 0.0))
    assert np.isfinite(feat).all(), "unwritten features"
    return feat


def fc1_fragments(w1) -> np.ndarray:
    """The prepared buffer's first part (fused_dense.cuh: fc1_fragment): [4 FEAT][8] halves, entry e =
    (s * 2 + mt) * 32 + lane a uint4 of 4 f16x2 words, the lower half first (pack_half2(lo, hi))."""
    n1, feat = w1.shape
    e = np.arange(4 * feat)
    lane, mt, s = e % 32, e // 32 % 2, e // 64
    wp = (16 * mt + lane // 4) * feat + 16 * s + 2 * (lane % 4)  # (output 16 mt + g, inputs 16 s + 2t)
    halves = [0, 1, 8 * feat, 8 * feat + 1, 8, 9, 8 * feat + 8, 8 * feat + 9]  # (+1), output + 8, inputs + 8, both
    assert wp.max() + halves[-1] < n1 * feat
    return np.asarray(w1, np.float32).ravel()[wp[:, None] + np.array(halves)].astype(np.float16)


def replay_fc1(feats, frags, warps: int = 8) -> np.ndarray:
    """fc1 (no bias) of a group's n <= 8 images as dense_fragments computes it: warp `warp` takes k-steps
    warp * STEPS .. + STEPS - 1 (STEPS = FEAT / warps / 16), its A tiles rebuilt from the fragments as
    mma.m16n8k16's A layout says, B from the features' rows (FEAT + 8 halves apart): each warp's tile, not yet
    summed (dense_tail's part) [warp][output][image]."""
    n, feat = feats.shape
    stride, steps = feat + 8, feat // warps // 16
    rows = np.full((8, stride), np.nan)  # images past n: stale or unset shared memory, only their columns see it
    rows[:n, :feat] = feats
    rows = rows.ravel()
    used = np.zeros(len(frags), int)
    part = np.zeros((warps, 32, 8))  # [warp][output][image]
    for warp in range(warps):
        for s in range(steps):
            k = (warp * steps + s) * 16
            f = G * stride + k + 2 * T  # B: image g, inputs k + 2t (+ 1), k + 2t + 8 (+ 9)
            assert (f % 2 == 0).all() and (f % stride + 9 < feat).all()  # aligned 32-bit loads inside the image's row
            B = np.zeros((16, 8))
            for k_off in (0, 8):
                for e in range(2):
                    B[2 * T + k_off + e, G] = rows[f + k_off + e]
            for mt in range(2):
                entry = ((warp * steps + s) * 2 + mt) * 32 + LANES
                used[entry] += 1
                words = frags[entry].astype(np.float64)  # [lane][8 halves]: a0, a1, a2, a3
                A = np.zeros((16, 16))
                for reg, (row_off, k_off) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
                    for e in range(2):
                        A[G + row_off, 2 * T + k_off + e] = words[:, 2 * reg + e]
                part[warp, 16 * mt:16 * mt + 16] += A @ B
    assert (used == 1).all(), "each fragment read once"
    return part


def replay_dense_tail(part, wt, n: int) -> np.ndarray:
    """fused_dense.cuh's dense_tail on the warps' partial sums part [warp][output][image]: each warp stores its
    mma D through rows PITCH = 36 words apart ([warp][image][output]), warp `img` lane o sums output o over
    the warps, + bias, ReLU, then each logit is lane products summed by a butterfly of shuffles (xor 16 .. 1,
    every lane ends with the sum) and lane m keeps logit m; the first n images' logits [n][N2]."""
    warps, pitch, n2 = part.shape[0], 36, wt["fc2.weight"].shape[0]
    shared = np.full(warps * 8 * pitch, np.nan)
    for warp in range(warps):
        for mt in range(2):  # d0, d1: (output mt*16 + g, images 2t, 2t+1); d2, d3: output + 8
            base = (warp * 8 + 2 * T) * pitch + mt * 16 + G
            for off, out, img in [(0, 0, 0), (pitch, 0, 1), (8, 8, 0), (pitch + 8, 8, 1)]:
                at = base + off
                assert len(set(at % 32)) == 32, "a store of part hits 32 distinct banks"
                assert np.isnan(shared[at]).all(), "part written twice"
                shared[at] = part[warp, mt * 16 + G + out, 2 * T + img]
    logits = np.full((n, n2), np.nan)
    for img in range(n):  # warp img; lanes are fc1's outputs
        at = [(wi * 8 + img) * pitch + LANES for wi in range(warps)]
        assert all(len(set(a % 32)) == 32 for a in at), "the loads hit 32 distinct banks"
        h = np.maximum(wt["fc1.bias"].astype(np.float64) + sum(shared[a] for a in at), 0)
        for m in range(n2):
            v = h * wt["fc2.weight"][m].astype(np.float64)
            for d in (16, 8, 4, 2, 1):
                v = v + v[LANES ^ d]
            assert np.allclose(v, v[0]), "every lane holds the sum"
            logits[img, m] = v[m] + wt["fc2.bias"][m]
    return logits


def reference_logits(x, wt):
    """float64: conv1, relu, pool 2, conv2, relu, pool 4, flatten, fc1, relu, fc2."""
    wt = {k: v.astype(np.float64) for k, v in wt.items()}
    y = maxpool2d_reference(np.maximum(conv2d_reference(x.astype(np.float64), wt["conv1.weight"], wt["conv1.bias"], 1), 0), 2, 2)
    y = maxpool2d_reference(np.maximum(conv2d_reference(y, wt["conv2.weight"], wt["conv2.bias"], 1), 0), 4, 4)
    h = np.maximum(y.reshape(len(x), -1) @ wt["fc1.weight"].T + wt["fc1.bias"], 0)
    return h @ wt["fc2.weight"].T + wt["fc2.bias"]


def random_weights(rng, size):
    lay = Layout(size, size)
    shapes = {"conv1.weight": (4, 1, 7, 7), "conv1.bias": (4,), "conv2.weight": (16, 4, 7, 7), "conv2.bias": (16,),
              "fc1.weight": (32, 16 * lay.HP2 * lay.WP2), "fc1.bias": (32,), "fc2.weight": (10, 32), "fc2.bias": (10,)}
    fan_in = {"conv1": 49, "conv2": 196, "fc1": shapes["fc1.weight"][1], "fc2": 32}
    return {k: (rng.uniform(-1, 1, s) / math.sqrt(fan_in[k.split(".")[0]])).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("size, c2r", [(86, 1), (86, 2), (84, 1), (84, 2)])  # 84: padded x1 rows, odd pooled sizes (39)
def test_the_layout_math_computes_the_network(tmp_path, size, c2r):
    rng = np.random.default_rng()
    var = load_registry()[NAME]
    network = LENET if size == 86 else network_of_size(tmp_path, size)
    var.check_shape(fused_shape(network, 2), {**var.defaults(), "C2R": c2r})  # registry constraints
    wt = load_weights(LENET) if size == 86 else random_weights(rng, size)
    x = rng.uniform(0.0, 1.0, (2, 1, size, size)).astype(np.float32)
    lay = Layout(size, size)
    prepared = prepared_buffer(wt)
    assert 2 * len(prepared) == var.prepared_bytes(fused_shape(network, 2), var.defaults())
    frags, tiles = prepared[:32 * lay.FEAT].reshape(4 * lay.FEAT, 8), prepared[32 * lay.FEAT:]
    feats = np.stack([replay_image(x[i, 0], tiles, wt["conv1.bias"], wt["conv2.bias"], lay, c2r)
                      for i in range(len(x))]).astype(np.float64)
    part = replay_fc1(feats, frags)
    w1 = wt["fc1.weight"].astype(np.float16).astype(np.float64)  # the fragments are fc1's weights in half
    fc1 = part.sum(axis=0).T[:len(x)]
    assert np.allclose(fc1, feats @ w1.T, rtol=1e-12, atol=1e-12)  # the same products, summed in another order
    logits = replay_dense_tail(part, wt, len(x))
    assert normwise_error(logits, reference_logits(x, wt)) <= var.tolerance


@pytest.mark.parametrize("size", [86, 84])
def test_the_registry_shared_bytes_is_the_kernels_layout_and_two_blocks_fit_an_sm(tmp_path, variant, size):
    network = LENET if size == 86 else network_of_size(tmp_path, size)
    shape, lay = fused_shape(network, 10000), Layout(size, size)
    (launch,) = variant.launch_plan(shape, variant.defaults())
    # prepare_weights, once when the weights are bound: fc1's 4 FEAT fragment entries, then the tiles' core-matrix
    # rows, a thread per 16 bytes; no workspace (nothing per forward but the image)
    (prepare,) = variant.prepare_plan(shape, variant.defaults())
    assert prepare.kernel == "prepare_weights" and launch.kernel == "network_forward"
    assert prepare.grid == ((4 * lay.FEAT + TILE_BYTES // 16 + 255) // 256, 1, 1) and prepare.block == (256, 1, 1)
    assert prepare.shared_bytes == 0 and variant.workspace is None
    assert variant.prepared_bytes(shape, variant.defaults()) == 64 * lay.FEAT + TILE_BYTES
    assert launch.shared_bytes == lay.shared_bytes()
    assert launch.grid == (264, 1, 1) and launch.block == (256, 1, 1)
    assert 2 * (launch.shared_bytes + 1024) <= 233472  # an H100 SM's 228 KB, 1 KB reserved per block
    if size == 86:
        assert prepare.grid == (21, 1, 1) and variant.prepared_bytes(shape, variant.defaults()) == 65536 + 19456
        assert launch.shared_bytes == 101504


def test_the_padded_path_builds_too(tmp_path, variant):
    """An 84 x 84 input: staged rows padded past W (the row-wise staging), odd pooled sizes (x1's padding
    rows, x2's padding row and column). No wgmma serialized (as above, an older NVRTC may serialize a
    non-default setting: xfail), no spills (as at LeNet-86)."""
    shape = fused_shape(network_of_size(tmp_path, 84))
    for params in variant.all_combinations():
        if params["BLOCKS"] != 264:
            continue
        build = compile_variant(variant, params, "sm_90a", shape)
        (kernel,) = [k for k in build.kernels if k.name == "network_forward"]
        assert kernel.spill_store_bytes == 0 and kernel.spill_load_bytes == 0, (params, build.log)
        serialized = "serialized" in build.log or "injected" in build.log
        if serialized and not is_default(variant, params) and nvrtc_tuple() < (13, 5):
            pytest.xfail(f"NVRTC {nvrtc_version()} serializes {params} at 84 x 84: {build.log}")
        assert not serialized, (nvrtc_version(), params, build.log)


@pytest.mark.parametrize("size, needs", [(100, "<= 8"), (87, "W % 2 == 0")])
def test_a_shape_it_cannot_compute_is_refused_naming_the_constraint(tmp_path, variant, size, needs):
    with pytest.raises(ShapeError) as info:
        variant.check_shape(fused_shape(network_of_size(tmp_path, size)), variant.defaults())
    assert str(info.value).startswith(f"variant '{NAME}' cannot handle") and needs in str(info.value)


def test_a_batch_smaller_than_the_grid_gets_a_block_per_image(variant):
    for batch, blocks in ((1, 1), (7, 7), (264, 264), (10001, 264)):
        (launch,) = [plan for plan in variant.launch_plan(fused_shape(LENET, batch), variant.defaults())
                     if plan.kernel == "network_forward"]
        assert launch.grid == (blocks, 1, 1)
