// sliding_window.cuh: the body shared by tf32_sliding_window.cu, tf32x3_sliding_window.cu and
// fp16_sliding_window.cu; each of those files picks its arithmetic (SPLIT, HALF) and includes this.
//
// The sliding-window kernel: conv + bias + ReLU + max-pool (the semantics of fused_conv_relu_pool.cu)
// on tensor cores, with the im2col gather gone: for one input row and one kernel row ky, the
// products of 16 output pixels with the K kernel columns form a GEMM whose A matrix
// A[pixel][kx] = x[row][x0 + pixel + kx] is a sliding window over that row (a Hankel matrix).
// Choosing the order of the mma's rows (pixels) and k (kernel columns) makes each thread's A
// fragment four CONSECUTIVE input elements, so A is four loads of one row segment straight into
// registers: no shared-memory staging, no offset tables, no im2col.
//
// Fragments (PTX ISA, mma.m16n8k8 .tf32; g = lane / 4, t = lane % 4):
//   A 16x8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
//   B 8x8:  b0 (k=t, n=g), b1 (k=t+4, n=g)
//   C 16x8: c0, c1 (g, 2t + 0/1), c2, c3 (g+8, 2t + 0/1)
// Orders: mma row g <-> pixel 2g, row g+8 <-> pixel 2g+1 (of the tile's 16); k index t <-> kx
// kap(t) = (0, 1, 4, 5)[t], k index t+4 <-> kap(t) + 2 (kx 0..7; kx >= K has zero weight). Then
// (a0, a1, a2, a3) = x[row][o], x[row][o+1], x[row][o+2], x[row][o+3] with o = x0 + 2g + kap(t),
// and the accumulator's pixel pair (2g, 2g+1) sits in one thread (c0/c2, c1/c3): the pool's
// horizontal max is in registers (P = 4 adds one shuffle, lanes g ^ 1).
// The n dimension: maps. With M = 4 only half of the 8 columns would be maps, so columns carry
// two conv rows: n = dr * 4 + m, B[kx][n] = k[m][c][d - dr][kx] for input row offset d; one mma
// then yields rows y and y+1 (a vertical pool pair: lanes t ^ 2). M % 8 == 0: n blocks of 8 maps.
//
// Mapping: a warp owns one image's band of PR pooled rows (P*PR conv rows, all W_pool * P used
// columns in TILES tiles of 16) and NB / MAP_SPLIT of the NB n8 blocks of maps (MAP_SPLIT warps
// share a band: fewer accumulators, more warps per SM); a block owns WARPS / MAP_SPLIT
// consecutive bands of one image, grid.x = B * ceil(bands / (WARPS / MAP_SPLIT)). For each
// channel and each of the band's P*PR + K - 1 input rows, a thread loads its A fragment per tile once and issues an mma into every conv row group that row
// feeds (up to K + RP - 1 of them): loads per mma fall as PR grows, accumulators grow with it.
// Where A comes from (STAGED):
//   0  four __ldg per fragment from global memory (L1 hits after the first) and four cvt.rna.
//   1  the block's input rows are staged once in shared memory, already rounded to tf32, as
//      "quad rows": entry j of a row holds elements j..j+3 (zero past W), so a fragment is ONE
//      LDS.128 (the warp's 20 distinct entries are consecutive: 4 conflict-free wavefronts)
//      and a cvt happens once per staged entry instead of once per use.
//   2  the same rows staged plainly (one load, cvt and store per element instead of four each
//      for a quad entry), a fragment is 4 conflict-free scalar LDS: 4 wavefronts as well.
// B fragments for every (channel, row offset, map block) are built once per block in shared
// memory, fragment-ordered (one conflict-free LDS.64 or LDS.128 per use).
//
// SPLIT = 3 is 3xTF32: x = big + small, k = big + small (each rounded to tf32), three mmas
// (small*big + big*small + big*big) recover fp32-class error at 3x the tensor work.
//
// Why faster than tf32_fused_pool (0.93 ms on LeNet conv2 at B=10000: ALU-bound on the gather's
// address arithmetic and shared-memory B loads, 4 blocks/SM): per mma this kernel issues ~0.2-0.7
// load instructions (no address table, no staging, no __syncthreads in the loop) instead of ~2.
// Predicted at B=10000 (H100, mma.sync tf32 ~0.5-1 per clock per SM): conv1 1600 mma/image,
// ~0.15-0.3 ms; conv2 3584 mma/image, ~0.3-0.4 ms; bound by mma issue and L1 load wavefronts.
// Requirements (registry constraints): stride 1, K <= 8, non-overlapping pool P = 2 or 4,
// M == 4 or M % 8 == 0, float32; the shape is compiled in (C, M, H, W, K, S, P, PS).
// Measured (bench, B=10000, STAGED 0): conv1 0.954 ms (PR 2), conv2 0.561 ms (PR 2); conv1 is far
// from its mma bound with ~2.5 global loads and 2.5 cvt per mma: hence STAGED.
// Measured (STAGED 1): conv1 0.563 ms (WARPS 4, PR 2); conv2 0.560 ms (WARPS 8, PR 1), where
// ncu shows PR 2 at 184 registers, 12.5% occupancy and 27% issue slots busy: hence MAP_SPLIT.
// v4 (STAGED 2, a warp per staged row): conv1 0.487 ms (WARPS 4, PR 2), conv2 0.483 ms (WARPS 8, PR 1).
// HALF (fp16_sliding_window) pairs k for mma.m16n8k16 (CPAIR, RPAIR below): conv1 0.391, conv2 0.575.
// Now (staging issues STAGE_BATCH rows' loads before their stores; ncu had fp16 conv2 waiting on
// global loads in 56% of its stalls): conv1 0.346 (tf32) / 0.257 ms (fp16) at WARPS 4, PR 2; conv2
// 0.448 / 0.308 ms at WARPS 4, PR 1. docs/performance.md has every version.
// Tunables: WARPS (warps per block), PR (pooled rows per warp), STAGED (where A comes from),
// MAP_SPLIT (warps per band), SPLIT (1: TF32, 3: 3xTF32), HALF (fp16 rows and mma, below).
#pragma once
#include "common.cuh"
#include "mma_f16.cuh"

#ifndef WARPS
#define WARPS 4
#endif
#ifndef PR
#define PR 1
#endif
#ifndef SPLIT
#define SPLIT 1
#endif
#ifndef STAGED
#define STAGED 1
#endif
#ifndef MAP_SPLIT
#define MAP_SPLIT 1
#endif
#ifndef HALF
#define HALF 0
#endif

static_assert(sizeof(conv_t) == 4, "tf32_sliding_window is written for float32");

namespace {

// The layer's shape, compiled in (the kernel's own int arguments of the same names are unused).
constexpr int kC = C_FIXED, kM = M_FIXED, kH = H_FIXED, kW = W_FIXED, kK = K_FIXED, kP = P_FIXED;
static_assert(S_FIXED == 1 && PS_FIXED == P_FIXED, "stride 1, non-overlapping pool");
static_assert(kK <= 8 && (kP == 2 || kP == 4) && (kM == 4 || kM % 8 == 0) && (SPLIT == 1 || SPLIT == 3),
              "see the registry constraints");
static_assert(!HALF || (STAGED == 2 && SPLIT == 1), "HALF stages plain rows (as fp16)");
// HALF pairs up k: one mma.m16n8k16 does the work of two m16n8k8 for the same A and B loads.
// CPAIR (an even channel count): k 0-7 are kx of channel c, k 8-15 kx of channel c + 1.
// RPAIR (odd C, M = 4 so row groups start at even band rows, odd K so a group reads an even
// number of rows): k 8-15 are kx of the next input row, against the next kernel row.
// Otherwise m16n8k8.
#define CPAIR (HALF && C_FIXED % 2 == 0)
#define RPAIR (HALF && !CPAIR && M_FIXED == 4 && K_FIXED % 2 == 1)
constexpr int CSTEP = CPAIR ? 2 : 1;  // channels per mma
constexpr int DSTEP = RPAIR ? 2 : 1;  // input rows (kernel rows) per mma

constexpr int H_POOL = (kH - kK + 1 - kP) / kP + 1, W_POOL = (kW - kK + 1 - kP) / kP + 1;
constexpr int TILES = (W_POOL * kP + 15) / 16;  // 16-pixel tiles covering the columns the pool uses
constexpr int RP = kM >= 8 ? 1 : 8 / kM;        // conv rows side by side in an mma's 8 columns
constexpr int NB = kM >= 8 ? kM / 8 : 1;        // n8 blocks of maps
constexpr int G = kP / RP;                      // row groups (mmas stacked vertically) per pooled row
constexpr int GROUPS = PR * G;                  // row groups of a warp's band
constexpr int D = kK + RP - 1;                  // input-row offsets one row group reads
constexpr int BAND_ROWS = PR * kP + kK - 1;     // input rows a band reads
constexpr int BANDS = (H_POOL + PR - 1) / PR;   // bands per image
constexpr int FRAGS = kC / CSTEP * (D / DSTEP) * NB;  // distinct B fragments
constexpr int NBW = NB / MAP_SPLIT;            // n8 map blocks per warp: MAP_SPLIT warps share a band
constexpr int BLOCK_BANDS = WARPS / MAP_SPLIT;  // bands per block
constexpr int GROUP_BANDS = (BANDS + BLOCK_BANDS - 1) / BLOCK_BANDS;  // band groups (blocks) per image
constexpr int SROWS = BLOCK_BANDS * PR * kP + kK - 1;  // staged rows per channel; those past H hold zeros
static_assert(!RPAIR || (RP == 2 && D % 2 == 0 && BAND_ROWS % 2 == 0), "row pairs start at even band rows");
static_assert(NB % MAP_SPLIT == 0 && WARPS % MAP_SPLIT == 0, "see the registry constraints and restrictions");
constexpr int QW = 16 * TILES + 4;              // quad entries per staged row: the largest o + 1
constexpr int PW = 16 * TILES + 8;              // plain staged row: the largest o + 3 + 1, rounded up to 4
#ifndef STAGE_BATCH
#define STAGE_BATCH 8  // staged rows a warp loads before storing them
#endif
#if CPAIR || RPAIR
typedef uint2 bfrag_t;  // b0, b1: {B[2t][g], B[2t+1][g]} of the pair's two channels or kernel rows
#elif HALF
typedef unsigned bfrag_t;  // b0: {B[2t][g], B[2t+1][g]} as f16x2
#elif SPLIT == 3
typedef uint4 bfrag_t;  // {big b0, big b1, small b0, small b1}
#else
typedef uint2 bfrag_t;  // {b0, b1}
#endif

__device__ __forceinline__ unsigned to_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// fp16 (HALF): mma.m16n8k8 .f16 has A = {a0: (g, 2t..2t+1), a1: (g+8, 2t..2t+1)} and B = {b0:
// (k 2t..2t+1, n g)}, f16x2 each, fp32 accumulate. With the same pixel order (row g <-> pixel 2g,
// g+8 <-> 2g+1) and k = kx, a0 = x[e], x[e+1] and a1 = x[e+1], x[e+2] for e = x0 + 2g + 2t (even):
// one 32-bit LDS each, a1 from a copy of the row shifted by one element so that it is aligned too
// (to_half, pack_half2, mma_f16, mma_f16_k16 and max_nan are in mma_f16.cuh).

__device__ __forceinline__ int kap(int t) { return (t & 1) | ((t & 2) << 1); }  // 0, 1, 4, 5

// The thread's A fragment of one tile: 4 consecutive elements of one input row (big and small
// halves for 3xTF32). Elements past W (only under zero weights or discarded pixels) read 0, so
// an Inf there cannot become 0 * Inf = NaN.
struct AFrag {
    unsigned big[4];
    unsigned small[SPLIT == 3 ? 4 : 1];
};

// x[col .. col+3] of one input row, zero past W (or everywhere when the row is past H). `inside`
// says col + 3 < W is known, which spares the column tests.
__device__ __forceinline__ float4 quad(const float *__restrict__ row, int col, bool row_ok, bool inside = false) {
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = row_ok && (inside || col + j < kW) ? __ldg(row + col + j) : 0.f;
    return make_float4(v[0], v[1], v[2], v[3]);
}

// The fragment from 4 fp32 values (rounded here), or from 4 values staged already rounded.
__device__ __forceinline__ AFrag fragment(float4 v, bool rounded) {
    AFrag a;
    const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        a.big[j] = rounded ? __float_as_uint(f[j]) : to_tf32(f[j]);
        if constexpr (SPLIT == 3) a.small[j] = to_tf32(f[j] - __uint_as_float(a.big[j]));
    }
    return a;
}

__device__ __forceinline__ void mma(float (&acc)[4], const AFrag &a, const bfrag_t &b) {
#if CPAIR || RPAIR
    mma_f16_k16(acc, a.big[0], a.big[1], a.big[2], a.big[3], b.x, b.y);
    return;
#elif HALF
    mma_f16(acc, a.big[0], a.big[1], b);
    return;
#elif SPLIT == 3  // the small terms first: they are the ones fp32 accumulation would otherwise lose
    mma_tf32(acc, a.small[0], a.small[1], a.small[2], a.small[3], b.x, b.y);
    mma_tf32(acc, a.big[0], a.big[1], a.big[2], a.big[3], b.z, b.w);
#endif
#if !HALF
    mma_tf32(acc, a.big[0], a.big[1], a.big[2], a.big[3], b.x, b.y);
#endif
}

// B fragment (c, d, nb) of this lane: column n = g is map m at conv row offset dr; k index t and
// t + 4 are kernel columns kap(t) and kap(t) + 2 of kernel row d - dr (HALF: k 2t, 2t + 1 are
// kernel columns 2t, 2t + 1; CPAIR: of channels c and c + 1, RPAIR: of kernel rows d and d + 1).
__device__ bfrag_t make_b(const conv_t *__restrict__ k, int c, int d, int nb, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int m = kM >= 8 ? nb * 8 + g : g % kM, dr = kM >= 8 ? 0 : g / kM, ky = d - dr;
#if HALF
    unsigned h2[2];
#pragma unroll
    for (int p = 0; p < CSTEP * DSTEP; ++p) {
        const int cp = CPAIR ? c + p : c, kyp = RPAIR ? ky + p : ky;
        float h[2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
            h[j] = kyp >= 0 && kyp < kK && 2 * t + j < kK ? k[((m * kC + cp) * kK + kyp) * kK + 2 * t + j] : 0.f;
        h2[p] = pack_half2(h[0], h[1]);
    }
#if CPAIR || RPAIR
    return make_uint2(h2[0], h2[1]);
#else
    return h2[0];
#endif
#else
    float w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int kx = kap(t) + 2 * h;
        w[h] = ky >= 0 && ky < kK && kx < kK ? k[((m * kC + c) * kK + ky) * kK + kx] : 0.f;
    }
    bfrag_t b;
    b.x = to_tf32(w[0]);
    b.y = to_tf32(w[1]);
#if SPLIT == 3
    b.z = to_tf32(w[0] - __uint_as_float(b.x));
    b.w = to_tf32(w[1] - __uint_as_float(b.y));
#endif
    return b;
#endif
}

}  // namespace

// MIN_BLOCKS: blocks per SM the register allocation must allow (__launch_bounds__' second argument).
// Absent or 1, the second argument is left out: NVRTC 13 allocates differently with an explicit 1
// (conv1 at 106 registers instead of 56, and 0.30 ms instead of 0.26 on the H100).
#if defined(MIN_BLOCKS) && MIN_BLOCKS > 1
#define WINDOW_LAUNCH_BOUNDS __launch_bounds__(WARPS * 32, MIN_BLOCKS)
#else
#define WINDOW_LAUNCH_BOUNDS __launch_bounds__(WARPS * 32)
#endif

extern "C" __global__ void WINDOW_LAUNCH_BOUNDS conv_relu_pool_window(CONV_ARGS, POOL_ARGS) {
    // b_s[f][lane], f = (c / CSTEP * (D / DSTEP) + d / DSTEP) * NB + nb, built once per block.
    __shared__ bfrag_t b_s[FRAGS][32];
#pragma unroll 4
    for (int e = threadIdx.x; e < FRAGS * 32; e += WARPS * 32) {  // unrolled: several loads in flight
        const int f = e >> 5, nb = f % NB, d = (f / NB) % (D / DSTEP) * DSTEP, c = f / (NB * (D / DSTEP)) * CSTEP;
        b_s[f][e & 31] = make_b(k, c, d, nb, e & 31);
    }
    (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS;

    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int slot = (threadIdx.x >> 5) / MAP_SPLIT, nb0 = (threadIdx.x >> 5) % MAP_SPLIT * NBW;  // band slot, first map block
    const int b = blockIdx.x / GROUP_BANDS, band0 = blockIdx.x % GROUP_BANDS * BLOCK_BANDS, band = band0 + slot;
    const int y0 = band * PR * kP;
    const conv_t *__restrict__ xb = x + image_offset(b, kC, kH, kW);
    const int o = 2 * g + kap(t);
#if STAGED == 1
    // q_s[c][s][j] = x[c][band0 * PR * P + s][j .. j+3], tf32-rounded for SPLIT 1 (registry shared_bytes).
    extern __shared__ float4 q_s[];
    // A warp per staged row, lanes along it: the index arithmetic is per row, not per element
    // (ncu: the ALU pipe was the busiest, 56%, with per-element divisions here).
    for (int cs = threadIdx.x >> 5; cs < kC * SROWS; cs += WARPS) {
        const int row = band0 * PR * kP + cs % SROWS;
        const float *src = xb + (cs / SROWS * kH + row) * kW;
#pragma unroll
        for (int j = lane; j < QW; j += 32) {
            float4 v = quad(src, j, row < kH);
            if (SPLIT == 1)
                v = make_float4(__uint_as_float(to_tf32(v.x)), __uint_as_float(to_tf32(v.y)),
                                __uint_as_float(to_tf32(v.z)), __uint_as_float(to_tf32(v.w)));
            q_s[cs * QW + j] = v;
        }
    }
#elif STAGED == 2
    // HALF: h_s[c][s][copy][j] = half(x[c][band0 * PR * P + s][j + copy]), 4 bytes per element like
    // the fp32 rows. Otherwise p_s[c][s][j] = x[c][band0 * PR * P + s][j], tf32-rounded for SPLIT 1.
    // Zero past W and H. A warp per row, lanes along it (index math per row, not per element), and
    // the loads of STAGE_BATCH rows go out before any of their stores: with one row at a time, a
    // warp had one or two loads in flight and fp16 conv2 waited on them (ncu: 56% of its stalls).
#if HALF
    extern __shared__ unsigned short h_s[];
#else
    extern __shared__ float p_s[];
#endif
    constexpr int NJ = (PW + HALF + 31) / 32;  // elements per lane and row (HALF: PW + 1, for the shifted copy)
    for (int cs0 = threadIdx.x >> 5; cs0 < kC * SROWS; cs0 += WARPS * STAGE_BATCH) {
        float v[STAGE_BATCH][NJ];
#pragma unroll
        for (int u = 0; u < STAGE_BATCH; ++u) {
            const int cs = cs0 + u * WARPS, row = band0 * PR * kP + cs % SROWS;
            const float *src = xb + (cs / SROWS * kH + row) * kW;
#pragma unroll
            for (int jj = 0; jj < NJ; ++jj) {
                const int j = lane + 32 * jj;
                v[u][jj] = cs < kC * SROWS && row < kH && j < kW ? __ldg(src + j) : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < STAGE_BATCH; ++u) {
            const int cs = cs0 + u * WARPS;
            if (cs >= kC * SROWS) break;
#pragma unroll
            for (int jj = 0; jj < NJ; ++jj) {
                const int j = lane + 32 * jj;
#if HALF
                const unsigned short h = to_half(v[u][jj]);
                if (j < PW) h_s[cs * 2 * PW + j] = h;
                if (j > 0 && j <= PW) h_s[(cs * 2 + 1) * PW + j - 1] = h;
#else
                if (j < PW) p_s[cs * PW + j] = SPLIT == 1 ? __uint_as_float(to_tf32(v[u][jj])) : v[u][jj];
#endif
            }
        }
    }
#endif
    __syncthreads();
    if (band >= BANDS) return;  // the last group of an image may have idle warps

    float acc[GROUPS][TILES][NBW][4];
#pragma unroll
    for (int q = 0; q < GROUPS; ++q)
#pragma unroll
        for (int i = 0; i < TILES; ++i)
#pragma unroll
            for (int nb = 0; nb < NBW; ++nb) acc[q][i][nb][0] = acc[q][i][nb][1] = acc[q][i][nb][2] = acc[q][i][nb][3] = 0.f;

#pragma unroll 1
    for (int c = 0; c < kC; c += CSTEP) {
#pragma unroll
        for (int r = 0; r < BAND_ROWS; r += DSTEP) {
#if !STAGED
            const bool row_ok = y0 + r < kH;  // false only in an image's last, partial band (staged: zero rows)
#endif
#pragma unroll
            for (int i = 0; i < TILES; ++i) {
#if STAGED == 1
                const AFrag a = fragment(q_s[(c * SROWS + slot * PR * kP + r) * QW + 16 * i + o], SPLIT == 1);
#elif STAGED == 2 && HALF
                const unsigned short *row = h_s + (c * SROWS + slot * PR * kP + r) * 2 * PW + 16 * i + 2 * (g + t);
                AFrag a;  // big[0], big[1]: the f16x2 a0, a1; a2, a3 from channel c + 1 (CPAIR) or row r + 1
                a.big[0] = *reinterpret_cast<const unsigned *>(row);
                a.big[1] = *reinterpret_cast<const unsigned *>(row + PW);
#if CPAIR || RPAIR
                constexpr int PAIR = CPAIR ? SROWS * 2 * PW : 2 * PW;  // the pair's second row
                a.big[2] = *reinterpret_cast<const unsigned *>(row + PAIR);
                a.big[3] = *reinterpret_cast<const unsigned *>(row + PAIR + PW);
#endif
#elif STAGED == 2
                const float *src = p_s + (c * SROWS + slot * PR * kP + r) * PW + 16 * i + o;
                const AFrag a = fragment(make_float4(src[0], src[1], src[2], src[3]), SPLIT == 1);
#else
                const bool inside = 16 * i + 22 < kW;  // the tile's largest o + 3 is 16 i + 22 (folded: i is unrolled)
                const AFrag a = fragment(quad(xb + (c * kH + y0 + r) * kW, 16 * i + o, row_ok, inside), false);
#endif
                // The row groups this input row feeds: group q starts at band row q * RP.
#pragma unroll
                for (int q = 0; q < GROUPS; ++q) {
                    const int d = r - q * RP;
                    if (d < 0 || d >= D) continue;
#pragma unroll
                    for (int nb = 0; nb < NBW; ++nb)
                        mma(acc[q][i][nb], a, b_s[(c / CSTEP * (D / DSTEP) + d / DSTEP) * NB + nb0 + nb][lane]);
                }
            }
        }
    }

    // Epilogue: max over the pooled row's groups, its pixel pairs (in-thread) and, P = 4, lanes
    // g ^ 1; with two conv rows per mma (M = 4), lanes t ^ 2. Then bias, ReLU, one store per value.
    constexpr int DUPS = (kP == 4 ? 2 : 1) * (RP == 2 ? 2 : 1);  // lanes holding the same pooled values
    const int dup = (kP == 4 ? (g & 1) : 0) + (RP == 2 ? (t >> 1) * (kP == 4 ? 2 : 1) : 0);
    const long long ybase = image_offset(b, kM, H_POOL, W_POOL);
#pragma unroll
    for (int pr = 0; pr < PR; ++pr) {
        const int ph = band * PR + pr;
#pragma unroll
        for (int i = 0; i < TILES; ++i) {
#pragma unroll
            for (int nb = 0; nb < NBW; ++nb) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    v[e] = acc[pr * G][i][nb][e];
#pragma unroll
                    for (int q = 1; q < G; ++q) v[e] = max_nan(v[e], acc[pr * G + q][i][nb][e]);
                }
                float h[2] = {max_nan(v[0], v[2]), max_nan(v[1], v[3])};  // pixels 2g, 2g+1; columns 2t, 2t+1
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    if (kP == 4) h[j] = max_nan(h[j], __shfl_xor_sync(0xffffffffu, h[j], 4));
                    if (RP == 2) h[j] = max_nan(h[j], __shfl_xor_sync(0xffffffffu, h[j], 2));
                }
                const int pc = (16 * i + 2 * g) / kP;
                if (ph >= H_POOL || pc >= W_POOL) continue;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    if (DUPS > 1 && j != dup) continue;  // the lanes sharing two values store one each
                    const int n = 2 * t + j, m = kM >= 8 ? (nb0 + nb) * 8 + n : n % kM;
                    const float s = h[j] + __ldg(bias + m);
                    y[ybase + ((long long)m * H_POOL + ph) * W_POOL + pc] = s < 0.f ? 0.f : s;  // NaN stays NaN
                }
            }
        }
    }
}
