// wgmma_conv2: conv + bias + ReLU + max-pool (fp16_sliding_window's function, LeNet-86's conv2 first) on
// Hopper's warpgroup MMA, wgmma.mma_async m64n16k16 .f32.f16.f16 (sm_90a: registry arch).
//
// The optimization. fp16_sliding_window (0.290 ms on conv2 at batch 10000, H100) spends per 16x16x16 of
// work 8 mma.sync m16n8k16, each with a 64-bit shared load of its B fragment (2 KB of shared traffic)
// plus the A fragments (~0.7 KB: a fragment feeds every row group its input row reaches), at 4 blocks
// of 128 threads per SM. Here one wgmma does that 16x16x16 for each of a warpgroup's 4 warps at once,
// and B (the weights) is read by the tensor cores from shared memory through a descriptor: 512 bytes
// per wgmma, no load instruction, no B registers. A stays the sliding window of fp16_sliding_window
// (a fragment is consecutive elements of one staged input row, loaded straight into registers, used for
// every conv row of the band that input row feeds), read from the fp32 rows as cp.async lands them (two
// 64-bit and two 32-bit loads and four f16x2 conversions per fragment: no conversion pass, no second
// barrier). The next image arrives by cp.async into the second of two image buffers while one computes.
//
// Floor (conv2, batch 10000; docs/performance.md): 0.30 GB to move, 0.099 ms at 3.0 TB/s; 64.2 GFLOP
// that the pool keeps, 73.4 GFLOP as computed (kernel columns padded 7 -> 8), 0.074 ms at 989 TFLOP/s
// dense fp16, 0.098 ms at the measured 750. Per image: 224 wgmma (4 passes x 2 channel pairs x 28
// (input row, conv row) pairs; 1792 m16n8k16's work), each ~1.24 KB of shared traffic (A 0.73: a
// fragment serves 2.8 wgmma; B 0.5) plus 25.6 KB of staging: ~2100 shared wavefronts and ~1800 cycles
// of tensor work at full rate, ~76 images per SM. Expected: 0.12-0.18 ms (shared-memory wavefronts and
// the rate of a small-N wgmma), 1.6-2.4x faster than fp16_sliding_window; the target is 0.20 ms.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix ..."; g = lane / 4, t = lane % 4, w = warp of
// the warpgroup):
//   A (registers, per warp rows 16w..16w+15, as mma.m16n8k16's A): a0 (row g, k 2t..2t+1), a1 (row g+8,
//     k 2t..2t+1), a2 (row g, k 2t+8..2t+9), a3 (row g+8, k 2t+8..2t+9), f16x2 each, lower k in the
//     lower half. Rows are pixels: row g <-> pixel 2g of the warp's 16-pixel tile, row g+8 <-> 2g+1;
//     k 0-7 are kernel columns kx of channel 2cp, k 8-15 the same of channel 2cp+1. So with
//     e = 16 tile + 2g + 2t: a0 = x[c][row][e, e+1], a1 = x[c][row][e+1, e+2], a2, a3 the same of c+1.
//   D (fp32, per warp rows 16w..): d[4j + 0/1] (row g, column 8j + 2t + 0/1), d[4j + 2/3] (row g+8, ...):
//     a thread holds the pixel pair (2g, 2g+1) of maps 2t, 2t+1, 8+2t, 8+2t+1: the pool's horizontal max
//     is in registers (P = 4: one shuffle, lanes g ^ 1).
//   B (shared memory, K-major, no swizzle; imm-trans-b 0): B[k][n] = weight[n][2cp + k/8][d][k%8] (0 for
//     k%8 >= K) for channel pair cp and kernel row d. A core matrix is 8 n-rows of 16 bytes (8 k's of one
//     n), 128 contiguous bytes; the tile of one wgmma is 2 (k) x 2 (n) core matrices:
//       byte(k, n) = tile * 512 + (k / 8) * LBO + (n / 8) * SBO + (n % 8) * 16 + (k % 8) * 2,
//       LBO = 128 (next core matrix along K), SBO = 256 (next along N),
//     which is CUTLASS's canonical K-major INTERLEAVE layout ((8,n),(T,2)):((1T,SBO),(1,LBO)), T = 8
//     halves. Descriptor (64 bits): [0,14) start address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4,
//     [49,52) base offset 0, [62,64) swizzle 0 (none).
//
// Mapping: a warpgroup's 4 warps are SLOTS x TILES (tile = warp % TILES: 16 output columns; slot = warp
// / TILES: a band of PR pooled rows). One accumulator tile (64 x 16) per conv row q of the band; for
// each channel pair and each of the band's R = PR*P + K - 1 input rows r, every warp loads its A (row
// band * PR * P + r of its slot) and the warpgroup issues one wgmma per conv row q that row feeds, with
// the B tile of kernel row d = r - q (uniform across the warps: the slots differ in rows, not in r).
// A block (WG warpgroups) owns whole images, min(B, BLOCKS) blocks in turn over the batch; its
// warpgroups split an image's passes (SLOTS bands each).
// Requirements (registry constraints): stride 1, K <= 8, non-overlapping pool P = 2 or 4, M == 16, even
// C, W % 4 == 0 (16-byte rows for cp.async), 16-pixel tiles per row dividing 4, two images in shared memory.
// Tunables: WG (warpgroups per block), PR (pooled rows per band), BLOCKS (the grid).
#include "common.cuh"
#include "mma_f16.cuh"
#include "wgmma.cuh"

#ifndef WG
#define WG 2
#endif
#ifndef PR
#define PR 1
#endif

static_assert(sizeof(conv_t) == 4, "wgmma_conv2 reads float32");

namespace {

constexpr int kC = C_FIXED, kM = M_FIXED, kH = H_FIXED, kW = W_FIXED, kK = K_FIXED, kP = P_FIXED;
static_assert(S_FIXED == 1 && PS_FIXED == P_FIXED, "stride 1, non-overlapping pool");
static_assert(kM == 16 && kC % 2 == 0 && kK <= 8 && (kP == 2 || kP == 4) && kW % 4 == 0,
              "see the registry constraints");

constexpr int H_POOL = (kH - kK + 1 - kP) / kP + 1, W_POOL = (kW - kK + 1 - kP) / kP + 1;
constexpr int TILES = (W_POOL * kP + 15) / 16;  // 16-pixel tiles covering the columns the pool uses
static_assert(4 % TILES == 0, "a warpgroup's 4 warps are SLOTS x TILES");
constexpr int SLOTS = 4 / TILES;                      // bands side by side in one wgmma's 64 rows
constexpr int Q = PR * kP;                            // conv rows of a band: an accumulator tile each
constexpr int R = Q + kK - 1;                         // input rows a band reads
constexpr int BANDS = (H_POOL + PR - 1) / PR;         // bands per image
constexpr int PASSES = (BANDS + SLOTS - 1) / SLOTS;   // warpgroup passes per image
constexpr int THREADS = 128 * WG;
// Staged row pitch in floats: the row, and zeros to the largest column a fragment reads (16 TILES + 6).
constexpr int PW = kW > 16 * TILES + 8 ? kW : 16 * TILES + 8;
constexpr int IMAGE_FLOATS = kC * kH * PW;            // one image buffer (two: registry shared_bytes)
constexpr int CPAIRS = kC / 2;
constexpr int B_TILES = CPAIRS * kK;                  // one per (channel pair, kernel row)
constexpr int B_TILE_BYTES = 16 * kM * 2;             // k16 x n16 halves

// Every thread's share of image `xb`'s rows into `dst` (row pitch PW), 16 bytes per cp.async.
__device__ __forceinline__ void stage(const float *__restrict__ xb, float *dst) {
    constexpr int CHUNKS = kW / 4;
    const unsigned base = smem_u32(dst);
    for (int e = threadIdx.x; e < kC * kH * CHUNKS; e += THREADS) {
        const int row = e / CHUNKS, j = e % CHUNKS;  // row = c * H + y
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 4 * (row * PW + 4 * j)),
                     "l"(xb + row * kW + 4 * j)
                     : "memory");
    }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// One image from its staged rows `xs`: the warpgroup's passes, each SLOTS bands of PR pooled rows.
__device__ __forceinline__ void compute_image(const float *xs, unsigned b_base, const conv_t *__restrict__ bias,
                                              conv_t *__restrict__ y, int b) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2, tile = (warp & 3) % TILES, slot = (warp & 3) / TILES;
    const long long ybase = image_offset(b, kM, H_POOL, W_POOL);
#pragma unroll 1
    for (int pass = wg; pass < PASSES; pass += WG) {
        const int band = pass * SLOTS + slot;  // past BANDS in a last, partial pass: computed, never stored
        const int y0 = band * Q;               // the band's first conv row (and input row)
        float acc[Q][8];
#pragma unroll
        for (int q = 0; q < Q; ++q)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                acc[q][e] = 0.f;
                pin(acc[q][e]);
            }
#pragma unroll
        for (int cp = 0; cp < CPAIRS; ++cp) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                // Rows past H feed only conv rows the pool drops: clamped, so they read staged data.
                const int row = min(y0 + r, kH - 1);
                const float *src0 = xs + (2 * cp * kH + row) * PW + 16 * tile + 2 * (g + t);
                const float *src1 = src0 + kH * PW;  // channel 2 cp + 1
                const float2 u0 = *reinterpret_cast<const float2 *>(src0), u1 = *reinterpret_cast<const float2 *>(src1);
                unsigned a[4] = {pack_half2(u0.x, u0.y), pack_half2(u0.y, src0[2]), pack_half2(u1.x, u1.y),
                                 pack_half2(u1.y, src1[2])};
#pragma unroll
                for (int j = 0; j < 4; ++j) pin(a[j]);
                wgmma_fence();  // registers written (A here, the zeroed accumulators) before a wgmma reads them
#pragma unroll
                for (int q = 0; q < Q; ++q) {
                    const int d = r - q;  // kernel row: input row y0 + r feeds conv row y0 + q through it
                    if (d < 0 || d >= kK) continue;
                    wgmma_n16(acc[q], a, b_desc(b_base + (cp * kK + d) * B_TILE_BYTES));
                }
                wgmma_commit();
                wgmma_wait<1>();  // the row before has been read: its A registers may be written again
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int q = 0; q < Q; ++q)
#pragma unroll
            for (int e = 0; e < 8; ++e) pin(acc[q][e]);

        // Epilogue: max over the pooled row's conv rows (tiles), its pixel pairs (in-thread) and, P = 4,
        // lanes g ^ 1; then bias, ReLU, a store per value.
#pragma unroll
        for (int pr = 0; pr < PR; ++pr) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                v[e] = acc[pr * kP][e];
#pragma unroll
                for (int q = 1; q < kP; ++q) v[e] = max_nan(v[e], acc[pr * kP + q][e]);
            }
            // h[j]: map (j / 2) * 8 + 2t + j % 2, the max of pixels 2g and 2g+1
            float h[4] = {max_nan(v[0], v[2]), max_nan(v[1], v[3]), max_nan(v[4], v[6]), max_nan(v[5], v[7])};
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (kP == 4) h[j] = max_nan(h[j], __shfl_xor_sync(0xffffffffu, h[j], 4));
            const int ph = band * PR + pr, pc = (16 * tile + 2 * g) / kP;
            if (ph >= H_POOL || pc >= W_POOL || (kP == 4 && (g & 1))) continue;  // P = 4: lanes g, g^1 agree
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int m = (j >> 1) * 8 + 2 * t + (j & 1);
                const float s = h[j] + __ldg(bias + m);
                y[ybase + ((long long)m * H_POOL + ph) * W_POOL + pc] = s < 0.f ? 0.f : s;  // NaN stays NaN
            }
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) conv_relu_pool_wgmma(CONV_ARGS, POOL_ARGS) {
    // The weights as B tiles (static: one copy per block, read by the tensor cores) and two image
    // buffers (dynamic, registry shared_bytes): [2][C][H][PW] floats.
    __shared__ __align__(128) unsigned short b_s[B_TILES * B_TILE_BYTES / 2];
    extern __shared__ __align__(16) float x_s[];
    (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS;
    // cp.async moves 16-byte chunks: an x that is not 16-byte aligned leaves y as it was (poisoned in tests).
    if ((reinterpret_cast<unsigned long long>(x) & 15) != 0 || blockIdx.x >= B) return;

    const int first = blockIdx.x;
    stage(x + image_offset(first, kC, kH, kW), x_s);
    cp_async_commit();

    for (int e = threadIdx.x; e < B_TILES * 16 * kM; e += THREADS) {  // k fastest: B[k][n], k 0-15
        const int f = e / (16 * kM), n = (e / 16) % kM, kk = e % 16;
        const int c = 2 * (f / kK) + kk / 8, d = f % kK, kx = kk % 8;
        const float w = kx < kK ? __ldg(k + ((n * kC + c) * kK + d) * kK + kx) : 0.f;
        b_s[(f * B_TILE_BYTES + b_offset(kk, n)) / 2] = to_half(w);
    }
    // The zero columns past W, in both buffers (cp.async never writes them); PAD1: no division by 0 at PAD 0.
    constexpr int PAD = PW - kW, PAD1 = PAD > 0 ? PAD : 1;
    for (int e = threadIdx.x; e < 2 * kC * kH * PAD; e += THREADS) x_s[e / PAD1 * PW + kW + e % PAD1] = 0.f;
    // b_s was written by ordinary stores and is read by the tensor cores (the async proxy): each
    // writing thread fences before the barrier (the first __syncthreads below) that orders them.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const unsigned b_base = smem_u32(b_s);

    int it = 0;
#pragma unroll 1
    for (int b = first; b < B; b += gridDim.x, ++it) {
        const int next = b + gridDim.x;
        if (next < B) stage(x + image_offset(next, kC, kH, kW), x_s + ((it + 1) & 1) * IMAGE_FLOATS);
        cp_async_commit();  // empty at the last image: the wait below still counts it
        cp_async_wait<1>();  // this image's group has landed (this thread's copies) ...
        __syncthreads();     // ... and every thread's
        compute_image(x_s + (it & 1) * IMAGE_FLOATS, b_base, bias, y, b);
        __syncthreads();  // every warp is done with this buffer before the next prefetch overwrites it
    }
}
