"""wgmma_fused_network without a GPU: it builds for sm_90a through the project's NVRTC path (every setting,
no spills, 2 blocks per SM, no serialized wgmma: on an older NVRTC only the registry default must be free of
them, the others are xfailed naming the NVRTC), asks for wgmma, the fences and the bulk copy in its PTX
(HGMMA in its SASS where a disassembler is installed) with the B descriptors built before the image loop,
is refused in one line for sm_80 and plain sm_90, its registry shared_bytes is the kernel's layout, and
its layout math (kernels/wgmma_fused_network.cu's comment: pixel pairs as A rows, (conv row, map, pixel)
as N, B blocks in decreasing kernel row, conv1's unit table and padded maps), replayed in numpy, computes
LeNet-86's logits."""
import math
import re
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest

from test_wgmma import find_disassembler

from convsweep.checks import normwise_error
from convsweep.compile import compile_ptx, compile_source, compile_variant, nvrtc_version
from convsweep.errors import CompileError, ShapeError
from convsweep.network import load_network, load_weights
from convsweep.paths import ROOT
from convsweep.reference import conv2d_reference, maxpool2d_reference
from convsweep.variants import load_registry

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


SCHEDULE = ("C1N", "C1P", "C2R")  # what changes the code (BLOCKS is the grid only)


def is_default(variant, params) -> bool:
    return all(params[k] == variant.defaults()[k] for k in SCHEDULE)


def nvrtc_tuple() -> tuple[int, ...]:
    return tuple(int(part) for part in nvrtc_version().split("."))


@pytest.mark.parametrize("params", load_registry()[NAME].all_combinations(),
                         ids=lambda p: "-".join(f"{k}{v}" for k, v in sorted(p.items())))
def test_every_setting_builds_for_sm_90a_at_two_blocks_per_sm_without_spills_or_serialized_wgmma(variant, params):
    """ptxas says C7510-C7518 'wgmma.mma_async instructions are serialized' where it must wait after each
    wgmma (seen here while conv2's wgmma took accumulator runs that overlapped without being equal; with C1P 2
    while the M-block loop's trip count depended on the warpgroup, C7518, or the store was a branch), and
    C7517 'wgmma.wait_group is injected' where it adds a wait (seen while C1P 2 zeroed one accumulator set
    with the other's group in flight; the first wgmma now has scale-d false). The lent H100's NVRTC (13.0)
    serialized round two's C1P 2 where this machine's 13.5 did not: on an NVRTC older than 13.5 the
    registry default must still be free of it (it is what runs), another setting that is not is an xfail
    that names the NVRTC and ptxas' line (pytest -rx prints it), not a skip."""
    assert variant.arch == ("sm_90a",) and variant.min_cc == 9.0 and not variant.absorbs_input
    build = compile_variant(variant, params, "sm_90a", fused_shape(LENET))
    assert build.arch == "sm_90a" and build.cubin[:4] == b"\x7fELF"
    (kernel,) = build.kernels
    assert kernel.name == "network_forward", params
    # No spills; a small stack frame (local_bytes) may depend on the NVRTC release.
    assert kernel.spill_store_bytes == 0 and kernel.spill_load_bytes == 0, (params, build.log)
    assert kernel.registers <= 128, (params, kernel.registers)  # 2 blocks of 256 threads per SM
    serialized = [line for line in build.log.splitlines() if "serialized" in line or "injected" in line]  # C7510-C7518, C7517
    if serialized and not is_default(variant, params) and nvrtc_tuple() < (13, 5):
        pytest.xfail(f"NVRTC {nvrtc_version()} serializes {params}: {serialized[0].strip()}")
    assert not serialized, f"NVRTC {nvrtc_version()}, {params}: {serialized}"


def test_its_ptx_asks_for_wgmma_with_the_fences_hopper_needs(variant):
    for c1n in (16, 32):
        params = {**variant.defaults(), "C1N": c1n}
        ptx = compile_ptx(variant.source, NAME, variant.defines(params, fused_shape(LENET)), "sm_90a")
        assert ".target sm_90a" in ptx
        assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in ptx  # conv2, and conv1 at C1N 32
        assert ("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16" in ptx) == (c1n == 16)
        for instruction in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                            "fence.proxy.async.shared::cta", "mbarrier.try_wait.parity.shared::cta.b64",
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"):
            assert instruction in ptx, instruction
        assert "cp.async.cg" not in ptx  # the image is one bulk copy, not 16-byte chunks
        # The B descriptors are built once, before the image loop: every wgmma's descriptor register is
        # defined before the first wgmma (no address arithmetic rebuilds one inside the loops).
        first_wgmma = ptx.index("wgmma.mma_async")
        for desc in set(re.findall(r"wgmma\.mma_async[^;]*\}, (%rd\d+), p,", ptx)):
            defines = re.compile(rf"^\s*[a-z][\w.]*\s+{re.escape(desc)},", re.M)  # its first operand: written
            assert defines.search(ptx[:first_wgmma]), desc
            assert not defines.search(ptx[first_wgmma:]), f"{desc} rebuilt in the loops"
        # mma.sync is left only in fc1 (1% of the work): its m16n8k16 over 8 images, a few in an unrolled loop
        assert ptx.count("mma.sync.aligned") == ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") <= 8


def test_its_sass_is_hgmma(variant, tmp_path):
    tool = find_disassembler()
    if tool is None:
        pytest.skip("no nvdisasm or cuobjdump on PATH, in the venv's nvidia packages or under CUDA_HOME")
    cubin = tmp_path / "wgmma_fused_network.cubin"
    cubin.write_bytes(compile_variant(variant, variant.defaults(), "sm_90a", fused_shape(LENET)).cubin)
    sass = subprocess.run([*tool, str(cubin)], capture_output=True, text=True, check=True).stdout
    assert "HGMMA.64x32x16.F32" in sass


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
def test_a_target_without_wgmma_is_refused_in_one_line_naming_the_variant(variant, target):
    expected = f"variant '{NAME}' needs sm_90a (registry arch), got {target}"
    defines = variant.defines(variant.defaults(), fused_shape(LENET))
    for build in (lambda: compile_variant(variant, variant.defaults(), target, fused_shape(LENET)),
                  lambda: compile_source(variant.source, NAME, defines, target)):
        with pytest.raises(CompileError) as info:
            build()
        assert str(info.value) == expected and "\n" not in str(info.value)


# -- the layout math, replayed -------------------------------------------------------------------
# A numpy transliteration of kernels/wgmma_fused_network.cu's indexing (staging, B blocks and descriptors,
# A fragments, accumulator layouts, the epilogues' pools and shuffle), driven by the PTX ISA's fragment
# layouts: it checks the design's arithmetic, not the compiled code (tests/test_wgmma_fused_gpu.py does).
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
        d(self, "RG", (self.HP1 + 1) // 2)
        d(self, "UPR", (self.WP1 + 7) // 8)
        d(self, "UNITS", self.RG * self.UPR)
        d(self, "MB1", (self.UNITS + 7) // 8)
        d(self, "NB", (self.MB1 + 1) // 2)
        d(self, "UT", 16 * self.NB)
        d(self, "PW1", max(self.W, 16 * self.UPR + 6))
        d(self, "HR1", max(self.H, 4 * self.RG + 6))
        d(self, "PW2", max(38, 8 * self.UPR))
        d(self, "HR2", max(38, 2 * self.RG + 2))
        d(self, "CH2", (self.HR2 * self.PW2 + 63) // 64 * 64 + 16)

    def shared_bytes(self) -> int:
        feat = 16 * self.HP2 * self.WP2
        x1 = (2 * self.HR1 * self.PW1 + 15) // 16 * 16
        return 5 * 1024 + 2 * 7 * 1024 + 8 * self.UT + 4 * self.H * self.W + x1 + 2 * 4 * self.CH2 + 2 * 8 * (feat + 8)

    def table(self) -> list[tuple[int, int]]:
        """conv1's unit table, in halves from x1's and x2's starts (the kernel's is in bytes, the same / 2)."""
        return [(4 * (u // self.UPR) * self.PW1 + 16 * (u % self.UPR), 2 * (u // self.UPR) * self.PW2 + 8 * (u % self.UPR))
                if u < self.UNITS else (0, 2 * self.RG * self.PW2) for u in range(self.UT)]


def b_offset(k, n):
    return (n // 8) * SBO + (k // 8) * LBO + (n % 8) * 16 + (k % 8) * 2


def b_read(mem, start, n_cols):
    """B [16 x n_cols] as the tensor cores read it through a descriptor at byte `start` (LBO, SBO, no swizzle)."""
    k, n = np.meshgrid(np.arange(16), np.arange(n_cols), indexing="ij")
    return mem[(start + b_offset(k, n)) // 2].astype(np.float64)


def d_place(i):
    """Register i of an m64nNk16 accumulator: (row within the warp's 16 for lanes G, column for lanes T)."""
    return G + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * T + i % 2


def conv1_blocks(v: int, lay: Layout, c1p: int) -> list[int]:
    """The M-blocks warpgroup v computes, in order: C1P 1 v, v + 2, ... < MB1; C1P 2 v, v + 2, ... NB of them
    for both warpgroups (v = 1's last may be all padding units)."""
    if c1p == 1:
        return list(range(v, lay.MB1, 2))
    return [v + 2 * i for i in range(lay.NB)]


def replay_image(x, w1, b1, w2, b2, lay: Layout, c1n: int, c1p: int = 1, c2r: int = 1) -> np.ndarray:
    """One image x [H, W] through conv1 and conv2 as the kernel indexes them; its fp16 features [16 * HP2 * WP2]."""
    H, W = lay.H, lay.W
    f16 = lambda a: np.asarray(a, np.float32).astype(np.float16)
    # The B tiles, as the kernel's setup loops write them.
    b1s = np.zeros(5 * 1024 // 2, np.float16)
    for e in range(5 * 512):
        f, n, kk = e // 512, (e // 16) % 32, e % 16
        ky, kx, m = 2 * f + kk // 8 - n // 8, kk % 8 - n % 2, (n % 8) // 2
        b1s[(f * 1024 + b_offset(kk, n)) // 2] = f16(w1[m, 0, ky, kx] if 0 <= ky < 7 and 0 <= kx < 7 else 0.0)
    b2s = np.zeros(2 * 7 * 1024 // 2, np.float16)
    for e in range(2 * 7 * 512):
        blk, n, kk = e // 512, (e // 16) % 32, e % 16
        cp, d = blk // 7, 6 - blk % 7
        c, kx, m = 2 * cp + kk // 8, kk % 8 - n % 2, n // 2
        b2s[(blk * 1024 + b_offset(kk, n)) // 2] = f16(w2[m, c, d, kx] if 0 <= kx < 7 else 0.0)
    # stage_input: x1 [HR1][PW1], zero past W and below H (zeroed once); x2 zeroed once.
    x1 = np.zeros((lay.HR1, lay.PW1), np.float16)
    x1[:H, :W] = f16(x)
    x1 = x1.ravel()
    x2 = np.zeros(4 * lay.CH2, np.float16)
    written = np.zeros(4 * lay.CH2, int)
    table = lay.table()
    assert lay.PW2 >= 8 * lay.UPR and lay.HR2 >= 2 * lay.RG + 2 and lay.HR2 * lay.PW2 <= lay.CH2  # stores stay in their map

    # conv1
    for v in range(2):
        for mb in conv1_blocks(v, lay, c1p):
            D = np.zeros((4, 16, 32))  # [warp][row][column]
            A = np.zeros((5, 4, 16, 16))  # [f][warp][row][k]
            units = []
            for w in range(4):
                u_lo = 8 * mb + 2 * w  # the warp's table entry: units u_lo (rows g), u_lo + 1 (rows g + 8)
                assert u_lo + 1 < lay.UT
                (ld_lo, st_lo), (ld_hi, st_hi) = table[u_lo], table[u_lo + 1]
                units.append((st_lo, st_hi))
                src_lo, src_hi = ld_lo + 2 * (G + T), ld_hi + 2 * (G + T)
                for f in range(5):  # no clamp: rows 2f, 2f + 1 of the unit's rowgroup, immediates from two pointers
                    r0, r1 = 2 * f * lay.PW1, (2 * f + 1) * lay.PW1
                    for reg, (addr, row_off, k_off) in enumerate([(src_lo + r0, 0, 0), (src_hi + r0, 8, 0),
                                                                   (src_lo + r1, 0, 8), (src_hi + r1, 8, 8)]):
                        assert (addr % 2 == 0).all() and addr.max() + 1 < len(x1)  # aligned 32-bit loads inside x1
                        A[f, w, G + row_off, 2 * T + k_off] = x1[addr]
                        A[f, w, G + row_off, 2 * T + k_off + 1] = x1[addr + 1]
            A64 = A.reshape(5, 64, 16)
            for f in range(5):
                if c1n == 32:
                    D.reshape(64, 32)[:] += A64[f] @ b_read(b1s, f * 1024, 32)
                else:
                    if f < 4:
                        D.reshape(64, 32)[:, :16] += A64[f] @ b_read(b1s, f * 1024, 16)
                    if f > 0:
                        D.reshape(64, 32)[:, 16:] += A64[f] @ b_read(b1s, f * 1024 + 2 * SBO, 16)
            for w in range(4):
                acc = np.zeros((2, 8, 32))  # acc[h][i] per lane: register 8h + i of m64n32
                for h in range(2):
                    for i in range(8):
                        rows, cols = d_place(8 * h + i)
                        acc[h, i] = D[w, rows, cols]
                st_lo, st_hi = units[w]
                for h in range(2):
                    for half in range(2):
                        m4 = np.maximum(np.maximum(acc[h, 2 * half], acc[h, 2 * half + 1]),
                                        np.maximum(acc[h, 4 + 2 * half], acc[h, 5 + 2 * half]))
                        for lane in LANES:  # every lane stores: no predicate
                            s = m4[lane] + b1[T[lane]]
                            at = (st_hi if half else st_lo) + T[lane] * lay.CH2 + G[lane] + h * lay.PW2
                            x2[at] = f16(max(s, 0.0))
                            written[at] += 1
    maps = written.reshape(4, lay.CH2)[:, :lay.HR2 * lay.PW2].reshape(4, lay.HR2, lay.PW2)
    assert (maps[:, :lay.HP1, :lay.WP1] == 1).all(), "each pooled conv1 value written once"
    assert written.reshape(4, lay.CH2)[:, lay.HR2 * lay.PW2:].sum() == 0, "nothing past a map's rows"
    # the rest (columns >= WP1, rows >= HP1: padding units, rowgroups and blocks past the maps) is read only
    # by conv2 outputs that are not stored (4 HP2 + 5 <= HP1 - 1, the same for columns)
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
                    p0 = 2 * (G + T) + 2 * cp * lay.CH2 + row * lay.PW2
                    for (addr, row_off, k_off) in [(p0, 0, 0), (p0 + 16, 8, 0), (p0 + lay.CH2, 0, 8), (p0 + lay.CH2 + 16, 8, 8)]:
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
                    hv = []
                    for half in range(2):
                        xm = np.max([np.maximum(acc[q, h, 4 * i + 2 * half], acc[q, h, 4 * i + 2 * half + 1]) for q in range(4)], axis=0)
                        hv.append(np.maximum(xm, xm[LANES ^ 4]))  # __shfl_xor_sync(..., 4)
                    pc = G // 2 + 4 * (G & 1)
                    for lane in LANES:
                        if band >= lay.HP2 or pc[lane] >= lay.WP2:
                            continue
                        s = hv[G[lane] & 1][lane] + b2[m[lane]]
                        at = (m[lane] * lay.HP2 + band) * lay.WP2 + pc[lane]
                        assert np.isnan(feat[at]), "written twice"
                        feat[at] = f16(max(s, 0.0))
    assert np.isfinite(feat).all(), "unwritten features"
    return feat


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


@pytest.mark.parametrize("size, c1n, c1p, c2r", [(86, 32, 2, 2), (86, 16, 2, 1), (86, 32, 1, 1), (86, 16, 1, 2),
                                                  (84, 32, 2, 2), (84, 32, 1, 1)])  # 84: padded x1 rows, odd pooled sizes (39)
def test_the_layout_math_computes_the_network(tmp_path, size, c1n, c1p, c2r):
    rng = np.random.default_rng()
    var = load_registry()[NAME]
    network = LENET if size == 86 else network_of_size(tmp_path, size)
    var.check_shape(fused_shape(network, 2), {**var.defaults(), "C1N": c1n, "C1P": c1p, "C2R": c2r})  # registry constraints
    wt = load_weights(LENET) if size == 86 else random_weights(rng, size)
    x = rng.uniform(0.0, 1.0, (2, 1, size, size)).astype(np.float32)
    lay = Layout(size, size)
    feats = np.stack([replay_image(x[i, 0], wt["conv1.weight"], wt["conv1.bias"], wt["conv2.weight"], wt["conv2.bias"],
                                   lay, c1n, c1p, c2r) for i in range(len(x))]).astype(np.float64)
    w1 = wt["fc1.weight"].astype(np.float16).astype(np.float64)  # the dense phase packs fc1's weights to half
    hidden = np.maximum(feats @ w1.T + wt["fc1.bias"], 0)
    logits = hidden @ wt["fc2.weight"].T.astype(np.float64) + wt["fc2.bias"]
    assert normwise_error(logits, reference_logits(x, wt)) <= var.tolerance


@pytest.mark.parametrize("size", [86, 84])
def test_the_registry_shared_bytes_is_the_kernels_layout_and_two_blocks_fit_an_sm(tmp_path, variant, size):
    network = LENET if size == 86 else network_of_size(tmp_path, size)
    (launch,) = variant.launch_plan(fused_shape(network, 10000), variant.defaults())
    assert launch.shared_bytes == Layout(size, size).shared_bytes()
    assert launch.grid == (264, 1, 1) and launch.block == (256, 1, 1)
    assert 2 * (launch.shared_bytes + 1024) <= 233472  # an H100 SM's 228 KB, 1 KB reserved per block
    if size == 86:
        assert launch.shared_bytes == 95200


def test_the_padded_path_builds_too(tmp_path, variant):
    """An 84 x 84 input: staged rows padded past W (the row-wise staging), odd pooled sizes (x1's padding
    rows, x2's padding row and column). No wgmma serialized (as above, an older NVRTC may serialize a
    non-default setting: xfail), no spills at the registry default."""
    shape = fused_shape(network_of_size(tmp_path, 84))
    for params in variant.all_combinations():
        if params["BLOCKS"] != 264:
            continue
        build = compile_variant(variant, params, "sm_90a", shape)
        # No spills for the default; C1N 16 with C1P 2 and C2R 2 spilled 16 B here with NVRTC 13.5 (two M-blocks'
        # A and accumulators live at once): slower, still correct (the GPU tests run the padded path).
        assert build.kernels[0].spill_store_bytes <= (0 if is_default(variant, params) else 32), (params, build.log)
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
        (launch,) = variant.launch_plan(fused_shape(LENET, batch), variant.defaults())
        assert launch.grid == (blocks, 1, 1)
