// tma_conv1: conv + bias + ReLU + 2x2 max-pool for LeNet-86's conv1 shape (one input channel, four maps,
// odd K <= 7, stride 1), written against the memory floor: each image is streamed into shared memory by
// Hopper's bulk-copy engine (cp.async.bulk, one instruction for the whole image, completing on an
// mbarrier; sm_90, no sm_90a feature) several images ahead, and the math runs on mma.sync m16n8k16 from
// the fp32 rows as they landed, hidden under the stream.
//
// Which bound, and why this design. Per image conv1 must read 86*86*4 = 29,584 bytes and write the
// pooled 4*40*40*4 = 25,600: 0.552 GB at batch 10000, 0.183 ms at the 3.0 TB/s device copy the bench
// measures (0.165 ms at the rated 3.35). Its tensor work is 800 m16n8k16 per image (8.0 M mma, 32.8
// GFLOP issued, 25.1 useful): 0.044 ms at the measured 750 TFLOP/s. So it is bound by memory, 4x over
// the math, and 0.21 ms asks for ~87% of the copy rate. fp16_sliding_window (0.256 ms) is not there
// because it is bound by issue and shared-memory traffic (ncu: L1 87.7% busy, issue slots 70.5% of 324 us
// at the profiler's base clock: ~19,000 warp instructions an image): every block stages its rows itself
// (per-element __ldg, to_half, two 16-bit stores for a shifted copy, 6 of every 22 rows loaded twice)
// before a __syncthreads, and holds only what its staging warps' registers hold in flight. Here:
//   - input: one cp.async.bulk per image (29.6 KB, contiguous in x) from one producer thread into a ring
//     of STAGES image buffers per block; a block-resident persistent grid (BLOCKS) keeps STAGES images
//     per block in flight, 2-6 per SM (60-180 KB), far past the ~25 KB per SM that Little's law asks at
//     3 TB/s and ~1 us. No staging instructions, no conversion pass, no __syncthreads in the loop: a
//     full mbarrier per buffer says it landed, an empty one (every consumer thread arrives) frees it.
//   - math: a consumer warp owns a 16-pixel column tile of one band (SPLIT_H bands an image) and walks
//     its input row pairs top to bottom once; each pair's A fragment (4 LDS + 4 f16x2 converts, no
//     bank conflicts: 11 consecutive 8-byte words per warp) feeds the NPAIR = 4 pooled rows it reaches;
//     the accumulators rotate over 4 slots, a pooled row finished per pair. ~3,900 warp instructions an
//     image at SPLIT_H 2 (800 HMMA, 920 LDS, 920 F2FP, 200 epilogues of ~6), a fifth of fp16_sliding_window's.
//   - output: the n order (below) puts a pooled 2x2 window in one thread: 3 max, bias, ReLU, one STG.32
//     per lane and pooled row; a warp's store is 4 full 32-byte sectors (8 columns of each of 4 maps).
// Predicted: memory-bound at ~0.19-0.20 ms (2.8-2.9 TB/s, 1.04-1.1x the 0.183 ms floor); ncu: DRAM ~85-90%,
// issue slots ~25-30%, tensor pipe ~30% (6.7 pipe cycles per HMMA, as the fused network's 43% implies),
// L1 ~25%, few eligible warps (they wait on the full barriers).
// wgmma does not pay here: with N = 8 (4 maps x 2 conv rows) a warpgroup's m64n8k16 is per warp exactly
// this mma's work, each warp still loads and converts its own A fragment, and the fence / commit / wait
// around it cost what a larger N (Toeplitz B over more pooled rows) saves in mma issues; the zeros such an
// N adds would be free only because memory bounds the kernel, which is also why no math change can help.
//
// Layouts (mma.m16n8k16 .row.col f16, fp32 accumulate; g = lane / 4, t = lane % 4; PTX ISA fragments):
//   rows (pixels):   row g <-> pixel 2g of the tile's 16, row g+8 <-> pixel 2g+1 (column c = 16 T + ..)
//   k:               k 0-7 <-> input row 2p, kernel column kx = k; k 8-15 <-> row 2p + 1, kx = k - 8
//   n:               n = 2m + dr <-> map m, conv row 2j + dr (pooled row j): all 8 columns are used
//   A (registers):   a0 = (x[2p][e], x[2p][e+1]), a1 = (x[2p][e+1], x[2p][e+2]), a2, a3 the same of row
//                    2p + 1, e = 16 T + 2 (g + t) (even: 8-byte aligned), lower k in the lower half
//   B (registers, per pair offset d = p - j in 0..NPAIR-1): B[k][n] = w[m][ky][kx], ky = 2d + k/8 - dr,
//                    0 where ky or kx is outside the kernel; b0 = (B[2t][g], B[2t+1][g]), b1 the same at
//                    k + 8 (so m = g / 2, dr = g % 2 for this lane's column g)
//   D:               d0 = (pixel 2g, map t, conv row 2j), d1 = (.., 2j + 1), d2, d3 = pixel 2g + 1: the
//                    pooled value (map t, row j, column 8 T + g) = max(d0, d1, d2, d3) in one thread
// Pooled row j of a band reads pairs j .. j + NPAIR - 1 (rows 2j .. 2j + K); its accumulator is slot
// j % NPAIR, started by the d = 0 mma (C = 0) and finished after pair j + NPAIR - 1.
// Reads past a row's end (the last tile's e + 2 up to column 16 TILES + 6) meet the next row's first
// elements or zeroed padding after the image: only zero weights (kx >= K) or pooled-away pixels use
// them, so finite inputs give exact results (as in fp16_sliding_window, an Inf input would reach a
// neighbour through a zero weight: fp16 inputs past 65504 are Inf anyway).
// Requirements (registry constraints): C 1, M 4, stride 1, 2x2 pool, odd K <= 7, even W, H*W % 4 == 0
// (every image 16-byte aligned and whole 16-byte chunks for the bulk copy), SPLIT_H dividing H_pool.
// Tunables: SPLIT_H (bands per image: consumer warps = tiles x SPLIT_H), STAGES (image buffers per
// block), BLOCKS (the persistent grid; 264 = 2 per SM of an H100).
#include "common.cuh"
#include "mma_f16.cuh"
#include "tma.cuh"

#ifndef SPLIT_H
#define SPLIT_H 1
#endif
#ifndef STAGES
#define STAGES 3
#endif

static_assert(sizeof(conv_t) == 4, "tma_conv1 reads float32");

namespace {

constexpr int kH = H_FIXED, kW = W_FIXED, kK = K_FIXED, kM = 4;
static_assert(C_FIXED == 1 && M_FIXED == 4 && S_FIXED == 1 && P_FIXED == 2 && PS_FIXED == 2,
              "one channel, four maps, stride 1, 2x2 pool (see the registry constraints)");
static_assert(kK % 2 == 1 && kK <= 7 && kW % 2 == 0 && kH * kW % 4 == 0, "see the registry constraints");

constexpr int H_POOL = (kH - kK - 1) / 2 + 1, W_POOL = (kW - kK - 1) / 2 + 1;
constexpr int TILES = (2 * W_POOL + 15) / 16;  // 16-pixel tiles covering the columns the pool uses
constexpr int NPAIR = (kK + 1) / 2;            // input row pairs a pooled row reads
static_assert(H_POOL % SPLIT_H == 0, "bands of equal height");
constexpr int NPR = H_POOL / SPLIT_H;          // pooled rows per band
constexpr int STEPS = NPR + NPAIR - 1;         // row pairs a band walks
constexpr int WARPS = TILES * SPLIT_H;         // consumer warps; one producer warp after them
constexpr int THREADS = 32 * (WARPS + 1);
static_assert(WARPS <= 31, "at most 1024 threads");
constexpr int IMAGE_FLOATS = kH * kW;
constexpr unsigned IMAGE_BYTES = 4u * IMAGE_FLOATS;
// A stage: the image as it lies in x, then zeros to the last column a fragment reads past the last row
// (16 TILES + 6), rounded to 128 bytes.
constexpr int REACH = 16 * TILES + 7;
constexpr int STAGE_FLOATS = (IMAGE_FLOATS + (REACH > kW ? REACH - kW : 0) + 31) / 32 * 32;
constexpr int PAD_FLOATS = STAGE_FLOATS - IMAGE_FLOATS;
constexpr unsigned SHARED_BYTES = 4u * STAGES * STAGE_FLOATS;  // the registry's shared_bytes says the same
constexpr int PAD1 = PAD_FLOATS > 0 ? PAD_FLOATS : 1;  // no division by 0 where there is no padding

// D = A B (the accumulator's first term: no zeroing instructions).
__device__ __forceinline__ void mma_first(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          const uint2 &b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "f"(0.f));
}

// This lane's B fragment for pair offset d (the layout above).
__device__ uint2 b_fragment(const conv_t *__restrict__ k, int d, int lane) {
    const int g = lane >> 2, t = lane & 3, m = g >> 1, dr = g & 1;
    unsigned h[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // k 0-7: row 2p, k 8-15: row 2p + 1
        const int ky = 2 * d + half - dr;
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int kx = 2 * t + j;
            v[j] = ky >= 0 && ky < kK && kx < kK ? __ldg(k + (m * kK + ky) * kK + kx) : 0.f;
        }
        h[half] = pack_half2(v[0], v[1]);
    }
    return make_uint2(h[0], h[1]);
}

// One warp's band of one image: `xs` is its first input row at its lane's column e, `yw` its lane's
// output (map t, the band's first pooled row, column 8 T + g).
__device__ __forceinline__ void walk(const float *xs, const uint2 (&b)[NPAIR], float bias_t, float *__restrict__ yw,
                                     bool store) {
    float acc[NPAIR][4];
#pragma unroll
    for (int p = 0; p < STEPS; ++p) {
        const float *r0 = xs + 2 * p * kW, *r1 = r0 + kW;
        const float2 u0 = *reinterpret_cast<const float2 *>(r0), u1 = *reinterpret_cast<const float2 *>(r1);
        const float v0 = r0[2], v1 = r1[2];
        const unsigned a0 = pack_half2(u0.x, u0.y), a1 = pack_half2(u0.y, v0);
        const unsigned a2 = pack_half2(u1.x, u1.y), a3 = pack_half2(u1.y, v1);
#pragma unroll
        for (int d = 0; d < NPAIR; ++d) {
            const int j = p - d;  // the pooled row pair p reaches through offset d
            if (j < 0 || j >= NPR) continue;
            if (d == 0)
                mma_first(acc[j % NPAIR], a0, a1, a2, a3, b[0]);
            else
                mma_f16_k16(acc[j % NPAIR], a0, a1, a2, a3, b[d].x, b[d].y);
        }
        const int j = p - (NPAIR - 1);  // finished with this pair
        if (j < 0) continue;
        const float(&a)[4] = acc[j % NPAIR];
        const float s = max_nan(max_nan(a[0], a[1]), max_nan(a[2], a[3])) + bias_t;
        if (store) yw[j * W_POOL] = s < 0.f ? 0.f : s;  // NaN stays NaN
    }
}

}  // namespace

// No register cap (__launch_bounds__' second argument): NVRTC 13 then allocates up to the cap (146 registers
// instead of 63 at 2 blocks per SM, a stack frame at 3); uncapped, every setting's grid is resident on an
// H100 (tests/test_tma_conv1.py checks the registers and shared memory per SM).
extern "C" __global__ void __launch_bounds__(THREADS) conv_relu_pool_tma(CONV_ARGS, POOL_ARGS) {
    // STAGES image buffers (dynamic, registry shared_bytes) and their full / empty barriers.
    extern __shared__ __align__(128) float x_s[];
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
    (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS;
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    // Too little shared memory, or an x the bulk copy cannot read (16-byte aligned): y stays as it was
    // (poisoned in tests).
    if (dynamic_bytes < SHARED_BYTES || (reinterpret_cast<unsigned long long>(x) & 15) != 0 || blockIdx.x >= B) return;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_u32(&full[s]), 1);              // the producer's expect_tx, then the bytes
            mbar_init(smem_u32(&empty[s]), 32 * WARPS);    // every consumer thread, done reading
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // The padding after each image is never written by a copy: zeros, once.
    for (int e = threadIdx.x; e < STAGES * PAD_FLOATS; e += THREADS)
        x_s[e / PAD1 * STAGE_FLOATS + IMAGE_FLOATS + e % PAD1] = 0.f;
    __syncthreads();

    if (warp == WARPS) {  // the producer: one thread keeps the ring full
        if (lane == 0) {
            int i = 0;
            for (int b = blockIdx.x; b < B; b += gridDim.x, ++i) {
                const int s = i % STAGES;
                if (i >= STAGES) mbar_wait(smem_u32(&empty[s]), (i / STAGES - 1) & 1);  // image i - STAGES read
                mbar_expect_tx(smem_u32(&full[s]), IMAGE_BYTES);
                bulk_load(smem_u32(x_s + s * STAGE_FLOATS), x + image_offset(b, 1, kH, kW), IMAGE_BYTES,
                          smem_u32(&full[s]));
            }
        }
        return;
    }

    const int g = lane >> 2, t = lane & 3, tile = warp % TILES, band = warp / TILES;
    uint2 bw[NPAIR];
#pragma unroll
    for (int d = 0; d < NPAIR; ++d) bw[d] = b_fragment(k, d, lane);
    const float bias_t = __ldg(bias + t);
    const int e = 16 * tile + 2 * (g + t);
    const bool store = 8 * tile + g < W_POOL;
    const int x_off = 2 * band * NPR * kW + e;                               // in a stage
    const int y_off = (t * H_POOL + band * NPR) * W_POOL + 8 * tile + g;     // in an image's pooled maps

    int i = 0;
#pragma unroll 1
    for (int b = blockIdx.x; b < B; b += gridDim.x, ++i) {
        const int s = i % STAGES;
        mbar_wait(smem_u32(&full[s]), (i / STAGES) & 1);
        walk(x_s + s * STAGE_FLOATS + x_off, bw, bias_t, y + image_offset(b, kM, H_POOL, W_POOL) + y_off, store);
        mbar_arrive(smem_u32(&empty[s]));
    }
}
