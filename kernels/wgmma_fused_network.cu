// wgmma_fused_network: fp16_fused_network's whole LeNet-86 forward in one kernel (conv1 -> ReLU -> pool ->
// conv2 -> ReLU -> pool -> flatten -> fc1 -> ReLU -> fc2, every intermediate map in shared memory), with
// both convs on Hopper's warpgroup MMA, wgmma.mma_async .f32.f16.f16 (sm_90a: registry arch).
//
// Where the time went (fp16_fused_network v5, 0.382 ms at batch 10000 on the lent H100; docs/performance.md):
// 800 (conv1) + 1792 (conv2) mma.sync m16n8k16 per image at 2 blocks of 8 warps per SM, each mma with its
// A fragment loaded from shared memory and conv2's B fragments reloaded per channel pair; ncu: tensor pipe
// 43%, issue slots 39%, 0.7 eligible warps per scheduler: latency- and shared-load-bound, about 8800
// cycles per image per SM.
// Floor: 98.3 GFLOP at batch 10000, 0.099 ms at 989 TFLOP/s dense fp16, 0.134 ms at the 735-751 measured;
// reading the fp32 input once 0.088 ms. As issued here (padding below) 5.80 MFMA per image, 2830 cycles
// per image per SM at the 2048 fp16 FMA per cycle of an H100 SM: 0.122 ms at 1.755 GHz.
//
// What changes.
//   conv2 (70% of the tensor work): 112 wgmma m64n32k16 per image (28 per channel pair and pass, a pass
//     per warpgroup) instead of 1792 mma.sync and their B loads. B (the weights) is read by the tensor cores
//     from shared memory through a descriptor; A (the pooled conv1 maps) comes from registers, 4 LDS.32 per
//     fragment serving up to 4 wgmma, as in wgmma_conv2 (0.181 ms for conv2 alone; ncu there: tensor pipe
//     43% at N = 16, the rate of a small-N wgmma). Here N doubles at no cost: a row of A is a PIXEL PAIR
//     and N holds (map, pixel of the pair), B[(c, k')][(m, s)] = w[m][c][d][k' - s], so one k16 (two
//     channels x 8 k') yields two neighbouring pixels of 16 maps (k' = kx + s < 8: the same 8-for-7 padding
//     as before); a warp's 16 rows are a whole used conv row (32 pixels), 4 warps 4 pooled rows (bands);
//     A is always 4-byte aligned, so x2 needs no shifted copy. (One wgmma over all the conv rows an input
//     row feeds, N up to 128, would be wider still, but ptxas serializes wgmma whose accumulator sets
//     overlap without being equal (C7511), and N 128 for every row pads conv2 by 1.43x and spills at 128
//     registers: tried at build time, not kept.)
//   conv1 (30%) is on wgmma too, because it pays: on mma.sync it had 800 m16n8k16 per image at mma.sync's
//     rate (half of wgmma's) plus 1.6 shared loads per mma; here an A row is a pool block's pixel pair,
//     k16 = two input rows x 8 k', N = (conv row dr of 4, map, pixel s) = 32: 65 wgmma per image (C1N 32;
//     C1N 16: 104 of N 16 that skip the zero columns), 2.13 MFMA (1.70 at C1N 16) against 1.64 on
//     mma.sync, in ~1040 tensor cycles instead of ~1600 at best. The 2x2 pool is then all in-thread (the
//     4 conv rows and both pixels are this thread's columns); no shifted copy of the input rows either.
// Prediction: 2830 tensor cycles per image per SM at full rate; at 60-75% of it (4 warpgroups per SM,
// with staging, epilogues and the dense phase between their wgmma) 0.16-0.20 ms, ~2x fp16_fused_network.
// ncu should show the tensor pipe above 55% and far fewer shared wavefronts (~2500 per image: A loads
// 1680, staging and cp.async 580, epilogue stores 240) than fp16_fused_network's ~5600.
//
// Phases (a block: 2 warpgroups = 8 warps; one wave of min(B, BLOCKS) blocks, block i taking the images
// i, i + gridDim.x, ... counted from the batch's end: a pass uploads x just before the forward, and the
// upload's last bytes are the likeliest still in L2; a small gain, round six below):
//   load   the next image's fp32 rows arrive by one bulk copy (cp.async.bulk, issued by thread 0, completing
//          on an mbarrier that every thread waits on) while this one computes;
//   stage  rows -> fp16 x1 [HR1][PW1] (rows past H: zeros, written once);
//   conv1  wgmma as above; the epilogue pools, adds the bias, applies ReLU, writes fp16 x2 [4][HR2][PW2];
//   conv2  wgmma as above; the epilogue writes the image's flattened fp16 features [16][8][8];
//   dense  after every GROUP (8) images: fc1 as mma.sync over the 8 images (1% of the work) on fp16 weight
//          fragments, + ReLU + fc2 in fp32 (fused_dense.cuh: a warp per image, fc2 by shuffles).
// Before any image (round five): prepare_weights, run once when the runner binds the weights (registry
// prepare), writes fc1's fragments and both convs' B tiles into the prepared buffer; a block's prologue
// fetches the tiles with one bulk copy, on the first image's mbarrier phase.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix ..."; g = lane / 4, t = lane % 4, w = warp of the
// warpgroup; tests/test_wgmma_fused.py replays them in numpy):
//   A (registers, per warp rows 16w..16w+15, mma.m16n8k16's A): a0 (row g, k 2t..2t+1), a1 (row g+8,
//     k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..), f16x2, lower k in the lower half.
//   D (fp32, m64nNk16): d[4j + e] (row g, column 8j + 2t + e), d[4j + 2 + e] (row g + 8, ...), e = 0, 1.
//   B (shared memory, K-major, no swizzle): core matrices of 8 n x 16 bytes (8 k), 128 contiguous bytes;
//       byte(k, n) = base + (n / 8) * SBO + (k / 8) * LBO + (n % 8) * 16 + (k % 8) * 2, LBO 128, SBO 256,
//     a 16 x 32 block 1024 bytes; descriptor [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4,
//     base offset 0, swizzle 0 (wgmma_conv2's, there at N = 16).
//   conv1: a unit is rowgroup rg (conv rows 4 rg..4 rg+3, pooled rows 2 rg, 2 rg+1) x pair block blk (pixel
//     pairs 8 blk..8 blk+7), rg < RG, blk < UPR. A warp's rows g are a unit of its lo slot (pair 8 blk + g),
//     rows g + 8 one of its hi slot; the 16 slots, j = 8 v + 2 w + (0 lo, 1 hi), are vertical strips (round
//     four): strip j % SPC of block column j / SPC, rowgroups STEPS1 (j % SPC) .. + STEPS1 - 1, one per
//     step (SPC = min(16 / UPR, RG), STEPS1 = ceil(RG / SPC): 3 strips of 7 for LeNet-86); UNEVEN (round
//     five, LeNet-86): warpgroup 1's strips are a step shorter (the table at `slot` below). k = 8 pp + k'
//     reads input row 4 rg + 2 f + pp, column 2 pair + k'. n = 8 dr + 2 m + s: B1[f][k][n] =
//     w1[m][2 f + pp - dr][k' - s]. Thread (g, t) then holds map t, conv rows dr = j, pixels 2 pair + e:
//     pooled row 2 rg + j / 2. Step i of a strip reads its row pairs 2 i .. 2 i + 4 (from the strip's
//     origin, row 4 rg0): pairs 2 i .. 2 i + 2 are step i - 1's, so a step loads 2 pairs (8 LDS), from two
//     base pointers + immediates; its 4 stores are base + i * (two pooled rows) + immediates. No clamp, no
//     predicate: x1 has HR1 = max(H, 4 (RG + 2 SPC) + 6) rows (past the strips' last reads, 4 LAST_RG + 9),
//     x2 rows of PW2 = max(38, 8 UPR) halves (every block's columns) and HR2 = max(38, 2 (RG + 2 SPC)) rows;
//     the strips' steps past RG - 1 compute conv rows past the maps and store into x2's padding rows, and
//     slots j >= UPR SPC (idle: LeNet-86 has one) step over unit 0's rows storing into rows 2 SPC STEPS1,
//     + 1 each time: below the strips' last rows, so no two warps ever store into the same element.
//     What conv1 writes past the maps (rows >= HP1, columns >= WP1) is finite and read by conv2 only for
//     outputs it does not store: a stored band reads rows <= 4 HP2 + 5 <= HP1 - 1, a stored pooled column
//     columns <= 4 WP2 + 5 <= WP1 - 1.
//   conv2: warp w of warpgroup v is band (pooled row) 4 v + w; row g <-> pixel pair 2g (pixels 4g, 4g+1),
//     row g + 8 <-> pair 2g + 1 (round five; pairs g and g + 8 before); k = 8 cc + k' reads
//     x2[2 cp + cc][4 band + r][2 pair + k']; in the block of kernel row d, n = 2 m + s: B2[cp][6 - d][k][n]
//     = w2[m][2 cp + cc][d][k' - s]; input row r feeds conv row q (accumulators acc[q], N 32) through the
//     block of d = r - q. Thread (g, t) holds maps 4j + t of pixels 4g .. 4g + 3: the 4x4 pool of pooled
//     column g is the 4 q accumulators and those 4 pixels, in the thread (no shuffle). Its reads, rows
//     4 band + r <= 37 and columns <= 37, stay inside x2 (HR2, PW2 >= 38): no clamp.
// Shapes: LeNet-86's (the static_asserts and registry constraints say which sizes may vary). absorbs_input
// is not supported (fp16_fused_network's u8-source upsample): this variant reads the fp32 input.
// Tunables (registry): BLOCKS (the grid; 264 = 2 per SM of an H100) and C2R (conv2's schedule only). Rounds one
// to three below also had C1N (conv1's wgmma width; 16 skipped the zero columns at N 16's rate) and C1P
// (conv1's M-blocks in flight), for conv1's M-blocks; round four's strips replaced both.
//
// Round two (issue 36 item 1). Round one (C1P 1, C2R 1) measured 0.329 ms at batch 10000 on the lent
// H100, beside fp16_fused_network's 0.382 ms in the same process. ncu (BLOCKS 264, C1N 32): 128 registers,
// 93,280 B shared, 2 blocks (16 warps) per SM, achieved occupancy 23.9%; 0.87 eligible of 3.82 active warps
// per scheduler, no eligible warp 52.7% of cycles, issue slots 45.6%, 8.1 cycles per issued instruction;
// tensor pipe 37.9%, L1/TEX 64.9%, DRAM 22%. 0.329 ms is ~7600 cycles per image per SM (15,200 per image
// per block), of which 2830 tensor cycles (37.9% x 7600 ~ 2880: the pipe metric counts work at full rate).
// Neither the tensor pipe, nor issue, nor shared memory is full: the time is exposed latency, and the
// schedule exposes wgmma's whole latency often. conv1 waited (wait_group 0) after each M-block's 5 wgmma,
// 7 times per warpgroup per image, with the epilogue after each wait and no wgmma in flight during it;
// conv2 committed a group per input row and waited for the one before (20 waits per pass), with only 4 A
// loads to cover between. (wgmma_conv2, the same per-row schedule alone: ~200 cycles per row step.)
// Floor unchanged: 0.122 ms for the padded tensor work at full rate (0.134 ms at the measured 735 TFLOP/s).
// Registers stay the bound on occupancy (conv2's 64 accumulators; 3 blocks would need <= 80 per thread),
// so this round raises the work in flight per warpgroup instead:
//   C1P 2: conv1's M-blocks in pairs, mb and mb + 2 issued back to back into two accumulator sets, then
//     wait_group 1 -> epilogue of mb (while mb + 2 runs) -> wait_group 0 -> epilogue of mb + 2: 4 waits per
//     warpgroup instead of 7, half of the epilogues hidden. Three things ptxas needed, else it serializes
//     every wgmma or injects waits (tests/test_wgmma_fused.py reads its log): the same round count for both
//     warpgroups ((MB1 + 3) / 4, unrolled; an M-block past MB1 computes clamped units and stores nothing,
//     C7518 otherwise), the first wgmma of each accumulator with scale-d false instead of zeroed registers
//     (C7517), and the epilogue's stores predicated, not branched around.
//   C2R 2: conv2 commits a group per 2 input rows (8 A loads together, up to 8 wgmma per group): 10
//     waits per pass instead of 20, twice the loads in flight. (C2R 5: ptxas serializes for registers, C7512.)
// Prediction: if an exposed wait costs ~150-200 cycles of a warpgroup's time (wgmma_conv2's row step), C1P 2
// saves ~600-1000 cycles per image per block and C2R 2 ~1000-1500, of ~15,200: 0.27-0.30 ms, tensor pipe
// 42-47%, fewer "no eligible" cycles; not the 0.20 ms target, which needs the phases of an image (stage,
// conv1, conv2, dense, each behind a block barrier) to overlap, i.e. fewer registers or warp specialization.
// The device script times every C1P x C2R x C1N at BLOCKS 264 beside round one's schedule, so the two moves
// are measured apart. (Round three replaced both schedules; below.)
//
// Round three (issue 36, "the instruction diet"). Round two measured 0.324 ms (C1P 1, C2R 2; fp16_fused_network
// 0.380 beside it); ncu: 128 registers, 2 blocks per SM, issue slots 47%, tensor pipe 38%, 0.89 eligible
// warps per scheduler, and 14,039 warp-instructions per image: conv1 8,476 (~163 per warp and M-block for
// 5 HGMMA: unit -> (rowgroup, block) divisions, clamped row addresses per load, the B descriptors rebuilt per
// wgmma, a predicated epilogue), conv2's wgmma part 2,400, its epilogue 913, the cp.async image loop 728,
// the prologue 546, stage 504, dense 448. 0.20 ms is ~5,230 cycles per image per SM at 1.98 GHz; at 47%
// issue efficiency that fits ~9,800 instructions. The floor: 5.80 MFMA per image, ~3,290 tensor cycles per
// image per SM at the 86% of peak an N32 RS wgmma reaches on this H100 (.scratch/wgrate.py): 0.126 ms.
// This round cuts instructions, with every index above unchanged:
//   conv1: the unit table (above): per warp and M-block 1 LDS.128, 2 adds, 20 LDS, 5 HGMMA, fence / commit /
//     wait, an epilogue of 4 x (3 max.NaN, add, max.NaN with 0, cvt, add, STS) and the loop: ~66 instead of
//     ~163. The bias is loaded once per block, not per image. C1P 2 is now a pipeline: both warpgroups run
//     NB = (MB1 + 1) / 2 M-blocks, unrolled; M-block i + 1 is issued into the other accumulator set before
//     i's wait_group 1, so i's epilogue runs under i + 1's wgmma; straight code with no branch or predicate.
//     (It costs v = 1 one padding M-block, 5 wgmma per image: ~2.4% more tensor work.)
//   B descriptors: computed before the image loop (their low words from the tiles' base; conv2's as base +
//     64 j per 1 KB block); the PTX has no address arithmetic feeding a descriptor inside the loops (a test
//     checks); whether ptxas then holds them in uniform registers or rematerializes is the SASS's to say.
//   conv2: no clamp (x2's rows), no zeroing (each accumulator's first wgmma has scale-d false), and C2R 1 a
//     software pipeline over 20 groups per pass: group i + 1's 4 A loads issued right after group i's
//     commit, before the wait_group 1 for group i - 1, into the third of three register sets, so their
//     latency passes under the wgmma in flight. (C2R 2 keeps two sets, loads after the wait: a third set of
//     8 spilled.)
//   image: one cp.async.bulk of the whole image (29.6 KB) per image, expect_tx on an mbarrier; every thread
//     waits on its phase before staging; the next copy is issued after the barrier that follows staging, as
//     the cp.async chunks were, so it still lands during conv1, conv2 and dense. One barrier per image fewer.
//   prologue: B tiles a core-matrix row (8 k, 16 bytes, one st.shared.v4) per thread and step.
//   registers: 102-118 at LeNet-86 for every setting (NVRTC 13.5), no spills; 2 blocks per SM as before
//     (95,200 B of shared memory: + the 896 B table, + 2 x2 rows).
// Prediction (before the device run), warp-instructions per image: conv1 ~3,400 (52 warp-M-blocks x ~66;
// ~3,900 if ptxas rebuilds descriptors with 2 uniform ops per wgmma), conv2 wgmma + A ~1,400 (per warp 56
// HGMMA, 40 LDS, 20 x fence / commit / wait), conv2 epilogue ~880, stage ~400, image load ~50, dense ~450,
// prologue ~40, loop ~30: ~6,600 in all (from 14,039), under the ~9,000 the plan asked. Issue slots then
// ~30%, so issue no longer bounds; the block barriers between phases and conv1's wait per M-block (C1P 1)
// do: with the other block and the other warpgroup filling those gaps, tensor pipe ~50-60%, i.e. ~5,500-
// 6,600 cycles per image per SM: 0.21-0.25 ms (0.23 most likely), 1.4x round two, C1P 2 a few % faster where
// the H100's NVRTC (13.0) does not serialize it. Short of the 0.20 target unless the tensor pipe passes ~63%.
// Measured (.scratch/wf37.sh on the lent H100, NVRTC 13.0, 2026-11-26; batch 10000, median of 20, beside
// fp16_fused_network's 0.384-0.386 ms): 0.256-0.265 ms for every setting (C1N 32 C1P 1 C2R 1, the default,
// 0.2570-0.2611; C1P 2 0.2564-0.2607, no setting serialized by 13.0, 102-126 registers, no spills): -21% on
// round two's 0.324. ncu (C1P 2): 7,842 warp-instructions per image (conv1 3,408, conv2 with its epilogue
// 3,338, stage 489), issue slots 32.8%, tensor pipe 49.1%, 0.52 eligible warps per scheduler: the count fell
// as predicted and issue no longer bounds; now latency does: the most stalled lines are conv2's
// WARPGROUP.ARRIVE (wgmma.fence, a warpgroup-wide arrive per commit group: ~25% of the stall samples),
// with 2 blocks of 2 warpgroups per SM to cover them. Not the target: see docs/performance.md.
//
// Round four (issue 36, "where the time goes"). First an ablation table of round three (the same binary with
// one piece removed, so the outputs are wrong and only the time counts; .scratch/r4 on the lent H100, batch
// 10000, median of 20): 0.262 ms whole; without the dense phase 0.221 (-16%), without conv1 0.168, without
// conv2 0.168, without staging 0.246, without the bulk copies 0.254. The dense phase, 1% of the FLOPs, cost
// 16%: after every 8 images every warp read its k-slice of fc1's fp32 weights (16 KB a warp, 128 KB a block,
// from L2 and in step with all 264 blocks) two k-steps at a time, converting as it went. Two changes, both
// measured in that session:
//   dense: fc1's weights are converted once per forward by a first launch (fc1_fragments, 16 blocks) into
//     the workspace as fp16 mma fragments (fused_dense.cuh: fc1_fragment), and a warp loads its whole slice,
//     16 LDG.128 a lane, before its first mma: half the bytes, one L2 latency a group. 0.262 -> 0.239-0.241.
//     (Tried beside it, no gain: dense phases staggered across blocks, 0.241; groups of 16 images, 0.239.)
//   conv1 as strips: conv1 cost the same as conv2 for 38% of the tensor work; without its A loads (the
//     wgmma fed constant registers) it saved 0.027 ms. Its M-blocks had every unit load all 5 of its row pairs
//     (20 LDS a warp and M-block, each an LDS.32 of 11 distinct words); walking each slot down a column of
//     units keeps 3 of the 5 in registers: 8 LDS a step, 1040 -> 544 an image. The 112 unit-steps (16 slots x
//     7) are 12% more conv1 tensor work than the 100 units, as the M-blocks' 104 were 4%. 0.240 -> 0.210-0.213.
//   Measured and not kept: x1 as row pairs, x2 as channel pairs (an LDS.64 for two A registers): 0; -1%
//   before the strips and 0 with them; the next image staged inside conv2's commit groups: 0; an L2 prefetch of the image after next: 0;
//   conv1's steps two in flight (two accumulator sets): 0; the block barrier between conv1 and conv2 dropped
//   (wrong outputs): -0.5%, so the barriers are not where the time goes.
// Bench (lent H100, median of 20): 0.210 ms, fp16_fused_network 0.381 beside it; the default sweep under nsys
// 0.2150. ncu: 122 registers, tensor pipe 61.5% (49.1% in round three), issue slots 37.2%, 0.63 eligible warps
// per scheduler, 3,662 shared wavefronts per image (4,331), 7,104 warp-instructions per image (7,842); stalls
// (SourceCounters, on the same kernel with x2 as channel pairs, as fast) short scoreboard 30% (conv2's A loads
// and register moves, the staging's loads), barrier 14% (the wgmma waits of conv1's steps, the block barriers),
// wait 14%. At 0.20 ms the pipe would be at ~65%: not reached; docs/performance.md says what next.
//
// Round five (issue 36). Ablations of round four (.scratch/r5 on the lent H100, forward alone, batch 10000,
// rounds of 20 interleaved): the fc1_fragments launch 0.004 ms (1.8%), each block's B-tile build 1.8%, fc2's
// 32-step chains 2.6%, the dense phase 7.5% (its fragment loads 3.6%), staging 5.9%. ncu's source view put
// 46% of the warps' samples in conv2 (half of them short-scoreboard waits on its A loads) and 12% in the
// staging: L1/TEX (shared memory) at 79-81% is the busiest unit. Kept, each measured beside the last:
//   prepare: fc1's fragments and the B tiles written once at bind time (above): -2.3% on the forward alone,
//     -4% with round four's extra launch; the dense tail a warp per image, fc2 by shuffles (within it).
//   UNEVEN strips: -0.3 to -0.5%. conv2's rows as pairs 2g, 2g + 1, its pool in-thread: -1.5% (the shuffles
//     competed with the shared loads; 8 per warp and image).
// Measured and not kept: conv1 reading the fp32 image (LDS.64 + cvt, no x1): +5%; the image straight from
// global memory into registers after conv1 (no raw buffer, an L2 prefetch ahead): +6-7% (its latency bare;
// held across conv1 it spills); conv1's stores paired by a shuffle (STS.32): +3.4%; blocks skewed or their
// dense phases staggered per SM: 0; 16-image dense groups: -0.2%, 128 registers; fc2's weights loaded
// before fc1's mma: 0.
// Bench (lent H100, median of 20): 0.197 ms (fp16_fused_network 0.379 beside it). ncu: 119 registers,
// 101.5 KB shared, 2 blocks per SM, SM throughput 61%, L1/TEX 79%, issue slots 35.6%, 3,290 shared
// wavefronts and 6,669 warp-instructions per image (3,662, 7,104 in round four).
// Round six: the images taken from the batch's end (scripts/forward_after_copy.py, 3 interleaved rounds on
// the lent H100, each forward gated so no event pair holds its launch): after a pageable upload 0.2115 ms
// against 0.2147 from the start, back to back 0.2049 against 0.2062; the bench is unchanged (0.198). What
// is left of a job's after-upload cost (+0.007 ms, both fused kernels alike) is neither L2 nor the GPU's idle
// before the forward (an idle 40 ms: -0.2%): docs/performance.md.
#include "common.cuh"
#include "mma_f16.cuh"
#include "wgmma.cuh"
#include "fused_dense.cuh"
#include "tma.cuh"

#ifndef C2R
#define C2R 1
#endif
static_assert(sizeof(conv_t) == 4, "wgmma_fused_network reads float32");

namespace {

static_assert(C_FIXED == 1 && M_FIXED == 4 && K_FIXED == 7 && S_FIXED == 1 && P_FIXED == 2 && PS_FIXED == 2,
              "conv1: 1 -> 4 maps, 7x7, stride 1, 2x2 pool (see the registry constraints)");
static_assert(M2_FIXED == 16 && K2_FIXED == 7 && S2_FIXED == 1 && P2_FIXED == 4 && PS2_FIXED == 4,
              "conv2: 4 -> 16 maps, 7x7, stride 1, 4x4 pool");
static_assert(N1_FIXED == 32 && N2_FIXED <= 32, "fc1: 32 outputs; fc2: at most 32");

constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int GROUP = 8;                                    // images per dense mma (its n)
constexpr int kH = H_FIXED, kW = W_FIXED, kK = K_FIXED;
constexpr int M1 = M_FIXED, M2 = M2_FIXED, K2 = K2_FIXED, N1 = N1_FIXED, N2 = N2_FIXED;
constexpr int HP1 = (kH - kK + 1) / 2, WP1 = (kW - kK + 1) / 2;                    // pooled conv1 maps
constexpr int HP2 = (HP1 - K2 + 1 - 4) / 4 + 1, WP2 = (WP1 - K2 + 1 - 4) / 4 + 1;  // pooled conv2 maps
constexpr int FEAT = M2 * HP2 * WP2;
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

// conv1's mapping: rowgroups of 4 conv rows, units of 8 pixel pairs (rowgroup rg, block blk), and 16 unit
// slots (2 warpgroups x 4 warps x lo / hi rows) that are vertical strips: SPC strips per block column,
// STEPS1 rowgroups each (not S: that is the kernel's stride argument).
constexpr int DR = 4;                          // conv rows per rowgroup (N = DR x 4 maps x 2 pixels)
constexpr int F1 = (DR + kK - 1 + 1) / 2;      // input row pairs a rowgroup reads: 5
constexpr int RG = (HP1 + 1) / 2, UPR = (WP1 + 7) / 8;
constexpr int SPC = cmin(16 / UPR, RG), STEPS1 = (RG + SPC - 1) / SPC;  // LeNet-86: 3 strips of 7 per column
// Uneven strips (round five): where the block columns are 5, warpgroup 1's 8 slots take a step fewer than
// warpgroup 0's and still cover every unit: warpgroup 0's strips are the first two of columns 0-3 (STEPS1
// long), warpgroup 1's the third of those (STEPS1 - 1) and four down column 4 (STEPS1 - 1 each). LeNet-86:
// 104 unit-steps for its 100 units instead of 112, no idle slot. Else every slot takes STEPS1 steps (above).
constexpr bool UNEVEN = UPR == 5 && 3 * STEPS1 - 1 >= RG && 4 * (STEPS1 - 1) >= RG;
constexpr int STEPS_V1 = UNEVEN ? STEPS1 - 1 : STEPS1;
constexpr int LAST_RG = UNEVEN ? 4 * (STEPS1 - 1) - 1 : SPC * STEPS1 - 1;  // the last rowgroup a strip steps on
constexpr int PW1 = cmax(kW, 16 * UPR + 6);    // staged input row (halves): every column a unit reads
// x1 rows: the image's, then zeros past the last a strip reads (4 SPC STEPS1 + 6 <= 4 (RG + SPC) + 2)
constexpr int HR1 = cmax(kH, 4 * (RG + 2 * SPC) + 6);
static_assert(HR1 >= 4 * LAST_RG + 10, "x1 holds every row a strip reads (4 LAST_RG + 9)");
// conv2's mapping: a band (pooled row) per warp, Q conv rows, R input rows; 4 bands per warpgroup pass.
constexpr int Q = 4, R = Q + K2 - 1, CPAIRS = M1 / 2;
constexpr int PW2 = cmax(38, 8 * UPR);         // x2 row (halves): conv2 reads columns <= 37, conv1 writes < 8 UPR
constexpr int HR2 = cmax(38, 2 * (RG + 2 * SPC));  // x2 rows: conv2 reads rows <= 37; conv1 writes rows <= 2 LAST_RG + 1
                                                   // (its strips' last steps), its idle slots 2 SPC STEPS1, + 1
static_assert(HR2 >= 2 * LAST_RG + 2 && (UNEVEN || HR2 >= 2 * SPC * STEPS1 + 2), "x2 holds every row conv1 stores");
constexpr int CH2 = (HR2 * PW2 + 63) / 64 * 64 + 16;         // halves per channel: 8 words past a multiple of 32,
                                                             // so conv1's stores of 4 maps hit distinct banks
constexpr int FEAT_STRIDE = FEAT + 8;                        // halves: images' feature rows 4 banks apart

static_assert(kK == 7 && K2 == 7 && M1 == 4 && M2 == 16 && F1 == 5, "the B tiles and N below");
static_assert(UPR <= 16, "a block column of units per slot at least");
static_assert(kW % 2 == 0 && PW1 % 2 == 0 && PW2 % 2 == 0, "32-bit A fragments: even columns and pitches");
static_assert(HP2 <= 2 * 4 && WP2 <= 8, "conv2: two warpgroup passes of 4 bands, 32 conv columns per warp");
static_assert(HP1 >= K2 + 3 && WP1 >= K2 + 3, "conv2 has a pooled output");
static_assert(4 * 7 + R - 1 < HR2 && 2 * 15 + 7 < PW2, "conv2's reads (bands 0-7, pairs 0-15) stay in x2's rows");
static_assert(C2R >= 1 && R % C2R == 0, "conv2's input rows per commit group divide the band's R = 10");
static_assert(FEAT % (16 * WARPS) == 0, "fc1: whole k16 steps per warp");

// Shared memory, bytes (registry shared_bytes says the same; the kernel checks it). B tiles first: the
// descriptors want 16-byte-aligned tiles, and the dynamic base is; the bulk copy wants raw 16-byte aligned.
constexpr int B1_BYTES = F1 * 1024;                          // conv1: a 16 x 32 block per row pair
constexpr int B2_BYTES = CPAIRS * K2 * 1024;                 // conv2: a 16 x 32 block per (channel pair, d)
constexpr int RAW_BYTES = 4 * kH * kW;                       // the next image, fp32, as it arrives
constexpr int X1_BYTES = (2 * HR1 * PW1 + 15) / 16 * 16;
constexpr int X2_BYTES = 2 * M1 * CH2;
constexpr int FEAT_BYTES = 2 * GROUP * FEAT_STRIDE;
constexpr int TILE_BYTES = B1_BYTES + B2_BYTES;               // both, as prepare_weights writes them
constexpr int FC1_BYTES = 64 * FEAT;                          // fc1's fragments, first in the prepared buffer
constexpr int OFF_B2 = B1_BYTES, OFF_RAW = OFF_B2 + B2_BYTES;
constexpr int OFF_X1 = OFF_RAW + RAW_BYTES, OFF_X2 = OFF_X1 + X1_BYTES, OFF_FEAT = OFF_X2 + X2_BYTES;
constexpr int SHARED_BYTES = OFF_FEAT + FEAT_BYTES;
static_assert((kH * kW) % 4 == 0, "each image starts 16-byte aligned and is whole 16-byte chunks (bulk copy)");
static_assert(RAW_BYTES % 16 == 0 && X2_BYTES % 16 == 0, "alignment of what follows");
static_assert(4 * WARPS * GROUP * (N1 + 4) <= 2 * kH * PW1, "fc partial sums (fused_dense.cuh: dense_tail) fit in x1's staged rows");

// raw (fp32 [kH][kW]) -> x1 (fp16 [HR1][PW1], zero past kW; rows past kH were zeroed once).
__device__ __forceinline__ void stage_input(const float *raw, unsigned short *x1) {
    if constexpr (PW1 == kW) {  // LeNet-86: the same contiguous array, four values per thread and step
        constexpr int N4 = kH * kW / 4, STEPS = (N4 + THREADS - 1) / THREADS;
#pragma unroll
        for (int i = 0; i < STEPS; ++i) {
            const int e = threadIdx.x + i * THREADS;
            if (i + 1 < STEPS || e < N4) {
                const float4 v = reinterpret_cast<const float4 *>(raw)[e];
                reinterpret_cast<uint2 *>(x1)[e] = make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
            }
        }
    } else {
        for (int e = threadIdx.x; e < kH * PW1 / 2; e += THREADS) {
            const int row = e / (PW1 / 2), j = 2 * (e % (PW1 / 2));
            const float2 v = j < kW ? *reinterpret_cast<const float2 *>(raw + row * kW + j) : make_float2(0.f, 0.f);
            reinterpret_cast<unsigned *>(x1)[e] = pack_half2(v.x, v.y);
        }
    }
}

// What a thread of conv1 keeps across images: where its warp's two strips start (its lane's offsets
// included) and how far a step moves their stores, the B descriptors and its map's bias.
struct Conv1Ctx {
    unsigned ld_lo, ld_hi;      // x1: rows g (lo strip) and g + 8 (hi strip): (row 4 rg0, column 16 blk + 2 (g + t))
    unsigned st_lo, st_hi;      // x2: map t, (pooled row 2 rg0, column 8 blk + g)
    unsigned step_lo, step_hi;  // x2 bytes per step (two pooled rows); 0 for an idle slot
    unsigned d1;                // B1's descriptor, low word: row pair f's block is d1 + 64 f
    float bm;
};

// The epilogue of a unit pair, once its commit group is complete: max of 4 (3 max.NaN), bias, ReLU as a
// max.NaN with 0 (NaN stays NaN), fp16, one 16-bit store each, no predicate (padding lands in padding).
__device__ __forceinline__ void conv1_store(const Conv1Ctx &c, unsigned st_lo, unsigned st_hi, Acc8 (&acc)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) pin(acc[h][i]);
    // acc[h][4j' + i]: conv row dr = 2h + j', pixel s = i, row g; + 2: row g + 8. Pooled row 2 rg + h.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float m4 = max_nan(max_nan(acc[h][2 * half], acc[h][2 * half + 1]),
                                     max_nan(acc[h][4 + 2 * half], acc[h][5 + 2 * half]));
            sts16_at((half ? st_hi : st_lo) + 2 * h * PW2, to_half(max_nan(m4 + c.bm, 0.f)));
        }
    }
}

// conv1 + bias + ReLU + 2x2 pool on wgmma: the warpgroup steps its 8 slots down their strips, STEPS1 steps,
// each 5 wgmma of N 32 (row pairs f) in one commit group on 16 accumulators (acc[h]: conv rows 2h, 2h + 1),
// then the pool in registers and 4 unpredicated stores. A step reads row pairs 2 i .. 2 i + 4 of its strips:
// 3 of them are the previous step's registers, so a step loads 2 row pairs (8 LDS), after the wait (no
// wgmma in flight then reads a register), their latency under the epilogue's arithmetic.
template <int STEPS>
__device__ __forceinline__ void conv1(const Conv1Ctx &c) {
    Acc8 acc[2];
    unsigned P[2 * STEPS + 3][4];  // row pair p of the strips: [0] lo's row 2p, [1] hi's, [2] lo's 2p + 1, [3] hi's
    auto load = [&](int p) {
        P[p][0] = lds32_at(c.ld_lo + 4 * p * PW1), P[p][1] = lds32_at(c.ld_hi + 4 * p * PW1);
        P[p][2] = lds32_at(c.ld_lo + 2 * (2 * p + 1) * PW1), P[p][3] = lds32_at(c.ld_hi + 2 * (2 * p + 1) * PW1);
#pragma unroll
        for (int j = 0; j < 4; ++j) pin(P[p][j]);
    };
#pragma unroll
    for (int p = 0; p < F1; ++p) load(p);
#pragma unroll
    for (int i = 0; i < STEPS; ++i) {
        wgmma_fence();  // A written before the wgmma read it
#pragma unroll
        for (int f = 0; f < F1; ++f) {  // no zeroing: the first wgmma has scale-d false (D = A * B)
            if (f == 0) wgmma_n32<0>(acc[0], acc[1], P[2 * i + f], desc_of(c.d1 + 64 * f));
            else wgmma_n32(acc[0], acc[1], P[2 * i + f], desc_of(c.d1 + 64 * f));
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (i + 1 < STEPS) load(2 * i + F1), load(2 * i + F1 + 1);  // the next step's two new row pairs
        conv1_store(c, c.st_lo + i * c.step_lo, c.st_hi + i * c.step_hi, acc);
    }
}
// conv2 + bias + ReLU + 4x4 pool into the image's flattened features: warpgroup v's pass, bands
// 4 v .. 4 v + 3 (warp w: band 4 v + w); per channel pair and C2R input rows r, one commit group of a
// wgmma (N 32) for each conv row q an input row feeds, q in [max(0, r - 6), min(3, r)], through kernel
// row d = r - q. A software pipeline over the groups: group i + 1's A fragments are loaded (into the third
// of three register sets) right after group i is issued, before the wait for group i - 1, so the loads'
// latency passes under the wgmma in flight.
__device__ __forceinline__ void conv2(unsigned src, unsigned short *feat, unsigned d2,
                                      const float *__restrict__ bias, int band, int lane) {
    const int g = lane >> 2, t = lane & 3;
    constexpr int GROUPS = CPAIRS * R / C2R;
    Acc8 acc[Q][2];
    constexpr int SETS = C2R == 1 ? 3 : 2;  // A register sets: C2R 1 loads a group ahead (below); C2R 2 has
                                            // no registers for a third set of 8 (ptxas spills)
    unsigned a[SETS][C2R][4];
    // src: x2's shared address of (channel 0, row 4 band, column 2 (2 g + t)): this lane's pair 2 g's k' 2t,
    // 2t + 1 of the band's first input row (A row g; row g + 8 is pair 2 g + 1, 2 columns on); no clamp: x2
    // has HR2 rows.
    auto load = [&](int grp, unsigned (&ag)[C2R][4]) {
        const int cp = grp / (R / C2R), r0 = grp % (R / C2R) * C2R;
#pragma unroll
        for (int i = 0; i < C2R; ++i) {
            const unsigned p0 = src + 2 * (2 * cp * CH2 + (r0 + i) * PW2), p1 = p0 + 2 * CH2;  // channels 2cp, 2cp + 1
            ag[i][0] = lds32_at(p0), ag[i][1] = lds32_at(p0 + 4), ag[i][2] = lds32_at(p1), ag[i][3] = lds32_at(p1 + 4);  // pairs 2g, 2g + 1
#pragma unroll
            for (int j = 0; j < 4; ++j) pin(ag[i][j]);
        }
    };
    load(0, a[0]);
#pragma unroll
    for (int grp = 0; grp < GROUPS; ++grp) {
        const int cp = grp / (R / C2R), r0 = grp % (R / C2R) * C2R;
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < C2R; ++i) {
            const int r = r0 + i;
#pragma unroll
            for (int q = 0; q < Q; ++q) {
                const int d = r - q;  // kernel row: input row 4 band + r feeds conv row 4 band + q through it
                if (d < 0 || d >= K2) continue;
                const unsigned long long desc = desc_of(d2 + 64 * (cp * K2 + (K2 - 1) - d));  // 1 KB blocks
                if (cp == 0 && d == 0) wgmma_n32<0>(acc[q][0], acc[q][1], a[grp % SETS][i], desc);  // acc[q]'s first
                else wgmma_n32(acc[q][0], acc[q][1], a[grp % SETS][i], desc);
            }
        }
        wgmma_commit();
        if (SETS == 3 && grp + 1 < GROUPS) load(grp + 1, a[(grp + 1) % SETS]);  // group grp - 2's set: complete
        wgmma_wait<1>();  // group grp - 1 is complete: its A set may be written again
        if (SETS == 2 && grp + 1 < GROUPS) load(grp + 1, a[(grp + 1) % SETS]);  // into group grp - 1's set
    }
    wgmma_wait<0>();
#pragma unroll
    for (int q = 0; q < Q; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 8; ++e) pin(acc[q][h][e]);
    // acc[q][h][4i + e]: map 4 (2h + i) + t, pixel 2 pair + e of conv row 4 band + q, pair 2g (e < 2) or 2g + 1
    // (e - 2): the 4 x 4 pool of pooled column g is all this thread's (4 conv rows x 4 pixels), no shuffle.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int m = 4 * (2 * h + i) + t;
            float x = max_nan(max_nan(acc[0][h][4 * i], acc[0][h][4 * i + 1]), max_nan(acc[0][h][4 * i + 2], acc[0][h][4 * i + 3]));
#pragma unroll
            for (int q = 1; q < Q; ++q)
                x = max_nan(x, max_nan(max_nan(acc[q][h][4 * i], acc[q][h][4 * i + 1]),
                                       max_nan(acc[q][h][4 * i + 2], acc[q][h][4 * i + 3])));
            if (band >= HP2 || g >= WP2) continue;
            feat[(m * HP2 + band) * WP2 + g] = to_half(max_nan(x + __ldg(bias + m), 0.f));  // NaN stays NaN
        }
    }
}

}  // namespace

// The weights as network_forward reads them, written once when the runner binds the weights (registry
// `prepare`), not per forward: fc1's as the dense phase's fp16 A fragments (fused_dense.cuh: fc1_fragment),
// 16 bytes per (k-step, m-tile, lane), then conv1's and conv2's B tiles in the byte layout of shared memory
// above, which the forward's prologue fetches with one bulk copy. A thread per 16-byte entry; y and x are
// null here (the runner binds weights before any input exists).
extern "C" __global__ void __launch_bounds__(256)
prepare_weights(CONV_ARGS, PREPARED_ARG, POOL_ARGS, FUSED_WEIGHTS(conv2), FUSED_WEIGHTS(fc1), FUSED_WEIGHTS(fc2)) {
    (void)y, (void)x, (void)bias, (void)B, (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS;
    (void)conv2_b, (void)fc1_b, (void)fc2_w, (void)fc2_b;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < 4 * FEAT) {
        reinterpret_cast<uint4 *>(prepared)[e] = fc1_fragment<FEAT>(fc1_w, e);
        return;
    }
    const int r = e - 4 * FEAT;  // a core-matrix row (8 k's of one n: 16 bytes) of the B tiles
    if (r >= TILE_BYTES / 16) return;
    const int blk = r / 64, n = (r / 2) % 32, kh = r % 2;  // block, column, k half (k = 8 kh + k')
    float wv[8];  // 0 where a kernel row or column falls outside 0..6
    if (blk < F1) {  // conv1: [f][n = 8 dr + 2 m + s][k = 8 pp + k'] = w1[m][2 f + pp - dr][k' - s]
        const int ky = 2 * blk + kh - n / 8, m = (n % 8) / 2, s = n % 2;
#pragma unroll
        for (int kp = 0; kp < 8; ++kp) {
            const int kx = kp - s;
            wv[kp] = ky >= 0 && ky < kK && kx >= 0 && kx < kK ? __ldg(k + (m * kK + ky) * kK + kx) : 0.f;
        }
    } else {  // conv2: [cp][6 - d][n = 2 m + s][k = 8 cc + k'] = w2[m][2 cp + cc][d][k' - s]
        const int b2 = blk - F1, cp = b2 / K2, d = K2 - 1 - b2 % K2, c = 2 * cp + kh, m = n / 2, s = n % 2;
#pragma unroll
        for (int kp = 0; kp < 8; ++kp) {
            const int kx = kp - s;
            wv[kp] = kx >= 0 && kx < K2 ? __ldg(conv2_w + ((m * M1 + c) * K2 + d) * K2 + kx) : 0.f;
        }
    }
    *reinterpret_cast<uint4 *>(static_cast<unsigned char *>(prepared) + FC1_BYTES + blk * 1024 + b_offset(8 * kh, n)) =
        make_uint4(pack_half2(wv[0], wv[1]), pack_half2(wv[2], wv[3]), pack_half2(wv[4], wv[5]), pack_half2(wv[6], wv[7]));
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
network_forward(CONV_ARGS, PREPARED_ARG, POOL_ARGS, FUSED_WEIGHTS(conv2), FUSED_WEIGHTS(fc1), FUSED_WEIGHTS(fc2)) {
    (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS, (void)fc1_w;
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    // Too little shared memory, or an x the bulk copy cannot read (16-byte aligned): the logits stay poisoned.
    if (dynamic_bytes < SHARED_BYTES || (reinterpret_cast<unsigned long long>(x) & 15) != 0 || blockIdx.x >= B) return;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long arrived;  // raw holds the next image (the bulk copy's mbarrier)
    unsigned short *b1s = reinterpret_cast<unsigned short *>(smem), *b2s = reinterpret_cast<unsigned short *>(smem + OFF_B2);
    float *raw = reinterpret_cast<float *>(smem + OFF_RAW);
    unsigned short *x1 = reinterpret_cast<unsigned short *>(smem + OFF_X1);
    unsigned short *x2 = reinterpret_cast<unsigned short *>(smem + OFF_X2);
    unsigned short *feat = reinterpret_cast<unsigned short *>(smem + OFF_FEAT);
    float *part = reinterpret_cast<float *>(x1);  // the dense phase's sums: x1 is idle until the next image
    const uint4 *fc1f = reinterpret_cast<const uint4 *>(prepared);  // prepare_weights wrote it
    const unsigned bar = smem_u32(&arrived);

    const int count = (B - 1 - blockIdx.x) / gridDim.x + 1;  // steps blockIdx.x, + gridDim.x, ... below B
    auto image = [=](long long step) { return static_cast<int>(B - 1 - step); };  // the batch from its end
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, v = warp >> 2, w = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    if (threadIdx.x == 0) {  // the B tiles and the first image, by the bulk-copy engine, on one mbarrier phase
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_expect_tx(bar, TILE_BYTES + RAW_BYTES);
        bulk_load(smem_u32(smem), static_cast<const unsigned char *>(prepared) + FC1_BYTES, TILE_BYTES, bar);
        bulk_load(smem_u32(raw), x + image_offset(image(blockIdx.x), 1, kH, kW), RAW_BYTES, bar);
    }

    // x2 zeroed once: columns and rows conv1 never writes read 0 (a zero weight times them must be 0);
    // x1's rows past kH likewise (stage never writes them). The B tiles arrive with image 0 (mbarrier phase 0,
    // waited on before conv1 reads them; written and read by the async proxy alone, so no proxy fence).
    for (int e = threadIdx.x; e < X2_BYTES / 4; e += THREADS) reinterpret_cast<unsigned *>(x2)[e] = 0u;
    for (int e = kH * PW1 / 2 + threadIdx.x; e < HR1 * PW1 / 2; e += THREADS) reinterpret_cast<unsigned *>(x1)[e] = 0u;

    // Kept across images: the strips' addresses and steps, the descriptors (no address arithmetic left in the
    // loops), the lane offsets. Slot j = 8 v + 2 w + (0: lo, 1: hi): UNEVEN (above), j < 8 strip j % 2 of block
    // column j / 2 (rowgroups STEPS1 (j % 2) ..), j < 12 strip 2 of column j - 8 (rowgroups 2 STEPS1 ..), else
    // strip j - 12 of column 4 (rowgroups (STEPS1 - 1) (j - 12) ..); otherwise strip j % SPC of block column
    // j / SPC, rowgroups STEPS1 (j % SPC) .., and slots past UPR SPC are idle: they recompute unit 0's
    // rowgroups and store into x2's rows 2 SPC STEPS1, + 1, past every strip's, which no stored conv2 output reads.
    Conv1Ctx c1;
    auto slot = [&](int j, unsigned &ld, unsigned &st, unsigned &step) {
        const int blk = UNEVEN ? (j < 8 ? j / 2 : j < 12 ? j - 8 : 4) : j / SPC;
        const int rg0 = UNEVEN ? (j < 8 ? j % 2 * STEPS1 : j < 12 ? 2 * STEPS1 : (j - 12) * (STEPS1 - 1)) : j % SPC * STEPS1;
        const bool used = UNEVEN || j < UPR * SPC;
        ld = smem_u32(x1) + 4 * (g + t) + (used ? 2 * (4 * rg0 * PW1 + 16 * blk) : 0);
        st = smem_u32(x2) + 2 * (t * CH2 + g) + 2 * (used ? 2 * rg0 * PW2 + 8 * blk : 2 * SPC * STEPS1 * PW2);
        step = used ? 2 * 2 * PW2 : 0;
    };
    slot(8 * v + 2 * w, c1.ld_lo, c1.st_lo, c1.step_lo);
    slot(8 * v + 2 * w + 1, c1.ld_hi, c1.st_hi, c1.step_hi);
    c1.bm = __ldg(bias + t);
    c1.d1 = held(desc_lo(smem_u32(b1s)));
    const unsigned d2 = held(desc_lo(smem_u32(b2s)));  // conv2's block j: d2 + 64 j
    const int band = 4 * v + w;
    const unsigned src2 = smem_u32(x2) + 4 * (2 * g + t) + 8 * band * PW2;
    __syncthreads();  // the barrier's init, the zeros

    for (int n = 0; n < count; ++n) {
        mbar_wait(bar, n & 1);  // raw holds image n (phase n of the barrier)
        stage_input(raw, x1);
        __syncthreads();  // x1 staged, raw read; the previous image's conv2 is done with x2
        if (threadIdx.x == 0 && n + 1 < count) {  // the next image lands while this one computes
            mbar_expect_tx(bar, RAW_BYTES);
            const long long next = blockIdx.x + (n + 1LL) * gridDim.x;
            bulk_load(smem_u32(raw), x + image_offset(image(next), 1, kH, kW), RAW_BYTES, bar);
        }
        if (v == 0) conv1<STEPS1>(c1);  // warpgroup-uniform: each instance is straight code
        else conv1<STEPS_V1>(c1);
        __syncthreads();  // x2 written; conv1 is done with x1
        conv2(src2, feat + n % GROUP * FEAT_STRIDE, d2, conv2_b, band, lane);
        if (n % GROUP == GROUP - 1 || n == count - 1) {
            __syncthreads();
            const int group_first = n - n % GROUP;
            const long long first = blockIdx.x + (long long)group_first * gridDim.x;  // the group's image i is
            const int stride = gridDim.x;                                              // step first + i * stride
            dense_fragments<WARPS, GROUP, FEAT, FEAT_STRIDE, N1, N2>(feat, part, fc1f, fc1_b, fc2_w, fc2_b, y,
                                                                   [=](int img) { return image(first + (long long)img * stride); },
                                                                   n % GROUP + 1, warp, lane);
            __syncthreads();  // dense is done with part (x1) before the next image is staged there
        }
    }
}
