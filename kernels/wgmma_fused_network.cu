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
// Phases (a block: 2 warpgroups = 8 warps; one wave of min(B, BLOCKS) blocks, block i taking images
// i, i + gridDim.x, ...):
//   load   the next image's fp32 rows arrive by cp.async (16-byte chunks) while this one computes;
//   stage  rows -> fp16 x1 [H][PW1];
//   conv1  wgmma as above; the epilogue pools, adds the bias, applies ReLU, writes fp16 x2 [4][HP1][PW2];
//   conv2  wgmma as above; the epilogue writes the image's flattened fp16 features [16][8][8];
//   dense  after every GROUP (8) images: fp16_fused_network's fc1 (mma.sync over the 8 images; 1% of the
//          work) + ReLU + fc2 in fp32.
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
//   conv1: unit u (of RG * UPR) = rowgroup rg = u / UPR (conv rows 4 rg..4 rg+3, pooled rows 2 rg, 2 rg+1)
//     x pair block blk = u % UPR (pixel pairs 8 blk..8 blk+7). M-block mb: warp w's rows g are unit
//     8 mb + 2 w (pair 8 blk + g), rows g + 8 unit 8 mb + 2 w + 1. k = 8 pp + k' reads input row
//     4 rg + 2 f + pp, column 2 pair + k'. n = 8 dr + 2 m + s: B1[f][k][n] = w1[m][2 f + pp - dr][k' - s].
//     Thread (g, t) then holds map t, conv rows dr = j, pixels 2 pair + e: pooled row 2 rg + j / 2.
//   conv2: warp w of warpgroup v is band (pooled row) 4 v + w; row g <-> pixel pair g (pixels 2g, 2g+1),
//     row g + 8 <-> pair g + 8; k = 8 cc + k' reads x2[2 cp + cc][4 band + r][2 pair + k']; in the block of
//     kernel row d, n = 2 m + s: B2[cp][6 - d][k][n] = w2[m][2 cp + cc][d][k' - s]; input row r feeds conv
//     row q (accumulators acc[q], N 32) through the block of d = r - q. Thread (g, t) holds
//     maps 4j + t of pixels 2g, 2g+1 (row g) and 2g+16, 2g+17 (row g+8): the 4x4 pool is the 4 q
//     accumulators, the pixel pair, and lanes g ^ 1 (one shuffle).
// Shapes: LeNet-86's (the static_asserts and registry constraints say which sizes may vary). absorbs_input
// is not supported (fp16_fused_network's u8-source upsample): this variant reads the fp32 input.
// Tunables (registry): BLOCKS (the grid; 264 = 2 per SM of an H100), C1N (conv1's wgmma width, above),
// C1P and C2R (round two, below: the schedule only; every index above is unchanged).
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
// are measured apart.
#include "common.cuh"
#include "mma_f16.cuh"
#include "wgmma.cuh"
#include "fused_dense.cuh"

#ifndef C1N
#define C1N 32
#endif
#ifndef C1P
#define C1P 2
#endif
#ifndef C2R
#define C2R 2
#endif
static_assert(sizeof(conv_t) == 4, "wgmma_fused_network reads float32");
static_assert(C1N == 16 || C1N == 32, "conv1's wgmma width");
static_assert(C1P == 1 || C1P == 2, "conv1's M-blocks in flight per warpgroup");

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

// conv1's mapping: rowgroups of 4 conv rows, units of 8 pixel pairs, M-blocks of 8 units.
constexpr int DR = 4;                          // conv rows per rowgroup (N = DR x 4 maps x 2 pixels)
constexpr int F1 = (DR + kK - 1 + 1) / 2;      // input row pairs a rowgroup reads: 5
constexpr int RG = (HP1 + 1) / 2, UPR = (WP1 + 7) / 8, UNITS = RG * UPR, MB1 = (UNITS + 7) / 8;
constexpr int PW1 = (kW > 16 * UPR + 6 ? kW : 16 * UPR + 6);  // staged input row (halves): every column read
// conv2's mapping: a band (pooled row) per warp, Q conv rows, R input rows; 4 bands per warpgroup pass.
constexpr int Q = 4, R = Q + K2 - 1, CPAIRS = M1 / 2;
constexpr int PW2 = (WP1 > 38 ? WP1 + WP1 % 2 : 38);         // staged pooled conv1 row (halves): columns <= 37 read
constexpr int CH2 = (HP1 * PW2 + 63) / 64 * 64 + 16;         // halves per channel: 8 words past a multiple of 32,
                                                             // so conv1's stores of 4 maps hit distinct banks
constexpr int FEAT_STRIDE = FEAT + 8;                        // halves: images' feature rows 4 banks apart

static_assert(kK == 7 && K2 == 7 && M1 == 4 && M2 == 16 && F1 == 5, "the B tiles and N below");
static_assert(kW % 2 == 0 && PW1 % 2 == 0 && PW2 % 2 == 0, "32-bit A fragments: even columns and pitches");
static_assert(HP2 <= 2 * 4 && WP2 <= 8, "conv2: two warpgroup passes of 4 bands, 32 conv columns per warp");
static_assert(HP1 >= K2 + 3 && WP1 >= K2 + 3, "conv2 has a pooled output");
static_assert(C2R >= 1 && R % C2R == 0, "conv2's input rows per commit group divide the band's R = 10");

// Shared memory, bytes (registry shared_bytes says the same; the kernel checks it). B tiles first: the
// descriptors want 16-byte-aligned tiles, and the dynamic base is.
constexpr int B1_BYTES = F1 * 1024;                          // conv1: a 16 x 32 block per row pair
constexpr int B2_BYTES = CPAIRS * K2 * 1024;                 // conv2: a 16 x 32 block per (channel pair, d)
constexpr int RAW_BYTES = 4 * kH * kW;                       // the next image, fp32, as it arrives
constexpr int X1_BYTES = (2 * kH * PW1 + 15) / 16 * 16;
constexpr int X2_BYTES = 2 * M1 * CH2;
constexpr int FEAT_BYTES = 2 * GROUP * FEAT_STRIDE;
constexpr int OFF_B2 = B1_BYTES, OFF_RAW = OFF_B2 + B2_BYTES, OFF_X1 = OFF_RAW + RAW_BYTES;
constexpr int OFF_X2 = OFF_X1 + X1_BYTES, OFF_FEAT = OFF_X2 + X2_BYTES;
constexpr int SHARED_BYTES = OFF_FEAT + FEAT_BYTES;
static_assert((kH * kW) % 4 == 0, "each image starts 16-byte aligned and is whole 16-byte chunks (cp.async)");
static_assert(RAW_BYTES % 16 == 0 && X2_BYTES % 16 == 0, "alignment of what follows");
static_assert(4 * (WARPS * N1 * GROUP + GROUP * N1) <= X1_BYTES, "fc partial sums fit where x1 is idle");

// Every thread's share of one image's 16-byte chunks into `raw`, as one cp.async group.
__device__ __forceinline__ void load_image(float *raw, const float *__restrict__ src) {
    const unsigned base = smem_u32(raw);
    for (int c = threadIdx.x; c < kH * kW / 4; c += THREADS)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 16 * c), "l"(src + 4 * c) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ void wait_image() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// raw (fp32 [kH][kW]) -> x1 (fp16 [kH][PW1], zero past kW).
__device__ __forceinline__ void stage_input(const float *raw, unsigned short *x1) {
    if constexpr (PW1 == kW) {  // LeNet-86: the same contiguous array, four values per thread and step
        for (int e = threadIdx.x; e < kH * kW / 4; e += THREADS) {
            const float4 v = reinterpret_cast<const float4 *>(raw)[e];
            reinterpret_cast<uint2 *>(x1)[e] = make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
        }
    } else {
        for (int e = threadIdx.x; e < kH * PW1 / 2; e += THREADS) {
            const int row = e / (PW1 / 2), j = 2 * (e % (PW1 / 2));
            const float2 v = j < kW ? *reinterpret_cast<const float2 *>(raw + row * kW + j) : make_float2(0.f, 0.f);
            reinterpret_cast<unsigned *>(x1)[e] = pack_half2(v.x, v.y);
        }
    }
}

// conv1 + bias + ReLU + 2x2 pool on wgmma: warpgroup v takes M-blocks v, v + 2, ...; each is 5 wgmma of
// N 32 (row pairs f; C1N 16: 8 of N 16) in one commit group on 16 accumulators (acc[h]: conv rows dr = 2h,
// 2h + 1), its 20 A registers loaded first; then the pool in registers. C1P 2: M-blocks in pairs, the
// second's group issued (into another accumulator set) before the first's wait, so the tensor cores work
// on it while this warpgroup pools and stores the first (wait_group 1, then 0).
__device__ __forceinline__ void conv1_issue(const unsigned short *x1, unsigned b1, int mb, int w, int g, int t,
                                            Acc8 (&acc)[2]) {
    const int u_lo = 8 * mb + 2 * w, u_hi = u_lo + 1;                     // this warp's rows g, g + 8
    const int ul = min(u_lo, UNITS - 1), uh = min(u_hi, UNITS - 1);       // past the last: computed, not stored
    const int rg_lo = ul / UPR, blk_lo = ul % UPR, rg_hi = uh / UPR, blk_hi = uh % UPR;
    const unsigned short *src_lo = x1 + 16 * blk_lo + 2 * (g + t), *src_hi = x1 + 16 * blk_hi + 2 * (g + t);
    unsigned a[F1][4];
#pragma unroll
    for (int f = 0; f < F1; ++f) {
        // Rows past kH feed only conv rows of pooled rows past HP1 (not stored): clamped, they read staged data.
        const int r0 = min(4 * rg_lo + 2 * f, kH - 1), r1 = min(4 * rg_lo + 2 * f + 1, kH - 1);
        const int s0 = min(4 * rg_hi + 2 * f, kH - 1), s1 = min(4 * rg_hi + 2 * f + 1, kH - 1);
        a[f][0] = lds32(src_lo + r0 * PW1);  // row g, k' 2t..: input row 2f, pixel pair 8 blk + g
        a[f][1] = lds32(src_hi + s0 * PW1);  // row g + 8: the other unit
        a[f][2] = lds32(src_lo + r1 * PW1);  // k 8 + 2t..: input row 2f + 1
        a[f][3] = lds32(src_hi + s1 * PW1);
#pragma unroll
        for (int j = 0; j < 4; ++j) pin(a[f][j]);
    }
    // No zeroing: each accumulator's first wgmma has scale-d false (D = A * B). (Zeroing them while the
    // other M-block's group is in flight made ptxas inject a wait there, C7517.)
    wgmma_fence();  // A written before the wgmma read it
#pragma unroll
    for (int f = 0; f < F1; ++f) {
        if (C1N == 32) {  // B's zero columns too (row pair 0 feeds conv rows 0, 1 only, pair 4 rows 2, 3)
            if (f == 0) wgmma_n32<0>(acc[0], acc[1], a[f], b_desc(b1 + f * 1024));
            else wgmma_n32(acc[0], acc[1], a[f], b_desc(b1 + f * 1024));
        } else {  // conv rows 0, 1 (columns 0-15) and 2, 3 (16-31, two core matrices on) apart, where fed
            if (f == 0) wgmma_n16<0>(acc[0], a[f], b_desc(b1 + f * 1024));
            if (f > 0 && f < F1 - 1) wgmma_n16(acc[0], a[f], b_desc(b1 + f * 1024));
            if (f == 1) wgmma_n16<0>(acc[1], a[f], b_desc(b1 + f * 1024 + 2 * SBO));
            if (f > 1) wgmma_n16(acc[1], a[f], b_desc(b1 + f * 1024 + 2 * SBO));
        }
    }
    wgmma_commit();
}

// The epilogue of M-block mb, once its commit group is complete.
__device__ __forceinline__ void conv1_store(unsigned short *x2, float bm, int mb, int w, int g, int t, Acc8 (&acc)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) pin(acc[h][e]);
    const int u_lo = 8 * mb + 2 * w, u_hi = u_lo + 1;
    const int ul = min(u_lo, UNITS - 1), uh = min(u_hi, UNITS - 1);
    const int rg_lo = ul / UPR, blk_lo = ul % UPR, rg_hi = uh / UPR, blk_hi = uh % UPR;
    // acc[h][4j' + e]: conv row dr = 2h + j', pixel s = e, row g; + 2: row g + 8. Pooled row 2 rg + h.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int u = half ? u_hi : u_lo, rg = half ? rg_hi : rg_lo, blk = half ? blk_hi : blk_lo;
            const float m4 = max_nan(max_nan(acc[h][2 * half], acc[h][2 * half + 1]),
                                     max_nan(acc[h][4 + 2 * half], acc[h][5 + 2 * half]));
            const int ph = 2 * rg + h, pc = 8 * blk + g;
            const float s = m4 + bm;
            // A predicated store, not a branch: ptxas serializes the wgmma (C7518) when a divergent path
            // runs while the other M-block's group is in flight.
            st_shared_u16_if(x2 + t * CH2 + ph * PW2 + pc, to_half(s < 0.f ? 0.f : s),  // NaN stays NaN
                             u < UNITS && ph < HP1 && pc < WP1);
        }
    }
}

__device__ __forceinline__ void conv1(const unsigned short *x1, unsigned short *x2, unsigned b1,
                                      const float *__restrict__ bias, int v, int w, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float bm = __ldg(bias + t);
    Acc8 acc0[2];
    if (C1P == 1) {
#pragma unroll 1
        for (int mb = v; mb < MB1; mb += 2) {
            conv1_issue(x1, b1, mb, w, g, t, acc0);
            wgmma_wait<0>();
            conv1_store(x2, bm, mb, w, g, t, acc0);
        }
    } else {  // two M-blocks per round, both groups issued before the first wait: mb + 2 runs on the tensor
              // cores while mb is pooled. Both warpgroups run the same count of rounds (a loop that ptxas
              // sees as uniform: with a trip count depending on v it serializes the wgmma, C7518); an
              // M-block past MB1 is computed on clamped units and not stored (its units u >= 8 MB1 >= UNITS).
        Acc8 acc1[2];
#pragma unroll
        for (int round = 0; round < (MB1 + 3) / 4; ++round) {
            const int mb = v + 4 * round;
            conv1_issue(x1, b1, mb, w, g, t, acc0);
            conv1_issue(x1, b1, mb + 2, w, g, t, acc1);
            wgmma_wait<1>();  // mb's group is complete (groups complete in order)
            conv1_store(x2, bm, mb, w, g, t, acc0);
            wgmma_wait<0>();
            conv1_store(x2, bm, mb + 2, w, g, t, acc1);
        }
    }
}

// conv2 + bias + ReLU + 4x4 pool into the image's flattened features: warpgroup v's pass, bands
// 4 v .. 4 v + 3 (warp w: band 4 v + w); per channel pair and input row r, one commit group of a wgmma
// (N 32) for each conv row q it feeds, q in [max(0, r - 6), min(3, r)], through kernel row d = r - q.
__device__ __forceinline__ void conv2(const unsigned short *x2, unsigned short *feat, unsigned b2,
                                      const float *__restrict__ bias, int v, int w, int lane) {
    const int g = lane >> 2, t = lane & 3, band = 4 * v + w;
    Acc8 acc[Q][2];
#pragma unroll
    for (int q = 0; q < Q; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                acc[q][h][e] = 0.f;
                pin(acc[q][h][e]);
            }
    const unsigned short *src = x2 + 2 * (g + t);
#pragma unroll
    for (int cp = 0; cp < CPAIRS; ++cp) {
#pragma unroll
        for (int r0 = 0; r0 < R; r0 += C2R) {
            // C2R input rows per commit group: their A fragments loaded together (more loads in flight),
            // their wgmma issued back to back; the group before stays in flight while these load.
            unsigned a[C2R][4];
#pragma unroll
            for (int i = 0; i < C2R; ++i) {
                // Rows past HP1 feed only conv rows of bands past HP2 (not stored): clamped, they read staged data.
                const int row = min(4 * band + r0 + i, HP1 - 1);
                const unsigned short *p0 = src + 2 * cp * CH2 + row * PW2, *p1 = p0 + CH2;  // channels 2cp, 2cp + 1
                a[i][0] = lds32(p0), a[i][1] = lds32(p0 + 16), a[i][2] = lds32(p1), a[i][3] = lds32(p1 + 16);  // pairs g, g + 8
#pragma unroll
                for (int j = 0; j < 4; ++j) pin(a[i][j]);
            }
            wgmma_fence();
#pragma unroll
            for (int i = 0; i < C2R; ++i) {
                const int r = r0 + i;
#pragma unroll
                for (int q = 0; q < Q; ++q) {
                    const int d = r - q;  // kernel row: input row 4 band + r feeds conv row 4 band + q through it
                    if (d < 0 || d >= K2) continue;
                    wgmma_n32(acc[q][0], acc[q][1], a[i], b_desc(b2 + (cp * K2 + (K2 - 1) - d) * 1024));
                }
            }
            wgmma_commit();
            wgmma_wait<1>();  // the group before has been read: its A registers may be written again
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int q = 0; q < Q; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 8; ++e) pin(acc[q][h][e]);
    // acc[q][h][4i + e]: map 4 (2h + i) + t, pixel 2 pair + e of conv row 4 band + q; pair g (e < 2) or g + 8.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int m = 4 * (2 * h + i) + t;
            float hv[2];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float x = max_nan(acc[0][h][4 * i + 2 * half], acc[0][h][4 * i + 2 * half + 1]);
#pragma unroll
                for (int q = 1; q < Q; ++q)
                    x = max_nan(x, max_nan(acc[q][h][4 * i + 2 * half], acc[q][h][4 * i + 2 * half + 1]));
                hv[half] = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 4));  // lanes g ^ 1: the other pixel pair
            }
            // lanes g, g ^ 1 agree: even g stores pooled column g / 2 (pairs g, g ^ 1), odd g column g / 2 + 4.
            const int pc = g / 2 + 4 * (g & 1);
            if (band >= HP2 || pc >= WP2) continue;
            const float s = (g & 1 ? hv[1] : hv[0]) + __ldg(bias + m);
            feat[(m * HP2 + band) * WP2 + pc] = to_half(s < 0.f ? 0.f : s);
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 2)
network_forward(CONV_ARGS, POOL_ARGS, FUSED_WEIGHTS(conv2), FUSED_WEIGHTS(fc1), FUSED_WEIGHTS(fc2)) {
    (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS;
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    // Too little shared memory, or an x cp.async cannot read in 16-byte chunks: the logits stay poisoned.
    if (dynamic_bytes < SHARED_BYTES || (reinterpret_cast<unsigned long long>(x) & 15) != 0 || blockIdx.x >= B) return;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned short *b1s = reinterpret_cast<unsigned short *>(smem), *b2s = reinterpret_cast<unsigned short *>(smem + OFF_B2);
    float *raw = reinterpret_cast<float *>(smem + OFF_RAW);
    unsigned short *x1 = reinterpret_cast<unsigned short *>(smem + OFF_X1);
    unsigned short *x2 = reinterpret_cast<unsigned short *>(smem + OFF_X2);
    unsigned short *feat = reinterpret_cast<unsigned short *>(smem + OFF_FEAT);
    float *part = reinterpret_cast<float *>(x1);  // the dense phase's sums: x1 is idle until the next image

    const int count = (B - 1 - blockIdx.x) / gridDim.x + 1;  // images blockIdx.x, + gridDim.x, ... below B
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, v = warp >> 2, w = warp & 3;
    load_image(raw, x + image_offset(blockIdx.x, 1, kH, kW));

    // The B tiles, k fastest (the layout above); 0 where a kernel row or column falls outside 0..6.
    for (int e = threadIdx.x; e < F1 * 512; e += THREADS) {  // conv1: [f][n = 8 dr + 2 m + s][k = 8 pp + k']
        const int f = e / 512, n = (e / 16) % 32, kk = e % 16;
        const int ky = 2 * f + kk / 8 - n / 8, kx = kk % 8 - n % 2, m = (n % 8) / 2;
        const float wv = ky >= 0 && ky < kK && kx >= 0 && kx < kK ? __ldg(k + (m * kK + ky) * kK + kx) : 0.f;
        b1s[(f * 1024 + b_offset(kk, n)) / 2] = to_half(wv);
    }
    for (int e = threadIdx.x; e < CPAIRS * K2 * 512; e += THREADS) {  // conv2: [cp][6 - d][n = 2 m + s][k = 8 cc + k']
        const int blk = e / 512, n = (e / 16) % 32, kk = e % 16;
        const int cp = blk / K2, d = K2 - 1 - blk % K2, c = 2 * cp + kk / 8, kx = kk % 8 - n % 2, m = n / 2;
        const float wv = kx >= 0 && kx < K2 ? __ldg(conv2_w + ((m * M1 + c) * K2 + d) * K2 + kx) : 0.f;
        b2s[(blk * 1024 + b_offset(kk, n)) / 2] = to_half(wv);
    }
    for (int e = threadIdx.x; e < X2_BYTES / 4; e += THREADS) reinterpret_cast<unsigned *>(x2)[e] = 0u;  // unwritten columns read 0
    // The B tiles were written by ordinary stores and are read by the tensor cores (the async proxy): each
    // writing thread fences before the barrier (the first __syncthreads below) that orders them.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const unsigned b1 = smem_u32(b1s), b2 = smem_u32(b2s);

    for (int n = 0; n < count; ++n) {
        wait_image();
        __syncthreads();  // raw holds image n; the previous image's phases are done with x1, x2 (and part)
        stage_input(raw, x1);
        __syncthreads();
        if (n + 1 < count) load_image(raw, x + image_offset(blockIdx.x + (n + 1) * gridDim.x, 1, kH, kW));  // lands during this image
        conv1(x1, x2, b1, bias, v, w, lane);
        __syncthreads();
        conv2(x2, feat + n % GROUP * FEAT_STRIDE, b2, conv2_b, v, w, lane);
        if (n % GROUP == GROUP - 1 || n == count - 1) {
            __syncthreads();
            const int group_first = n - n % GROUP;
            const long long first = blockIdx.x + (long long)group_first * gridDim.x;  // the group's image i is
            const int stride = gridDim.x;                                              // image first + i * stride
            dense<WARPS, GROUP, FEAT, FEAT_STRIDE, N1, N2>(feat, part, fc1_w, fc1_b, fc2_w, fc2_b, y,
                                                         [=](int img) { return first + (long long)img * stride; },
                                                         n % GROUP + 1, warp, lane);
        }
    }
}
