// wmma_8x32x16: the tensor-core implicit GEMM of wmma_16x16x16 (Y[m, n] = sum_r Kmat[m, r] *
// X[r, n], r = (c, p, q) over R = C*K*K, n = (b, h, w) over N = B*H_out*W_out, batch in N; fp16
// operands staged in shared memory, fp32 accumulators, bias added in a per-warp float scratch)
// with the fragment shape m8n32k16: A = weights, 8 maps x 16 rows; B = gathered input, 16 rows
// x 32 pixels.
// Why this shape: the maps are the short side of these GEMMs. LeNet conv1 has M = 4, so a 16-row
// fragment wastes 3/4 of every mma and of the weight staging, an 8-row one half; conv2 (M = 16)
// is two 8-row fragments with no waste. The 32-pixel side also makes every epilogue store one
// 128-byte row of 32 consecutive outputs of one map.
// Index reuse in the gather: a block has fewer threads than BLOCK_N columns (BLOCK_N >= 64 *
// WARPS), so each thread loads kCols = BLOCK_N / (32 * WARPS) >= 2 columns of every tile row. The
// columns' window origins (b, h*S, w*S) are decomposed once per thread; the row's (c, p, q) and
// its offset c*H*W + p*W + q are kept by a RowCursor (additions, no division), advanced once per
// row and reused by all kCols columns, so the per-element work of the gather is a predicated
// load, a cvt and a 16-bit shared store. Consecutive threads hold consecutive columns (the
// columns of a thread are kThreads apart), so a warp's loads are consecutive pixels.
// Mapping: grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M)), block WARPS * 32 threads; warps spread
// over N first (kWarpsN = min(WARPS, BLOCK_N / 32)), then M; each warp owns kWarpFragsM x
// kWarpFragsN fragments of 8 x 32 outputs.
// Expected gain over register_tiled_gemm: as wmma_16x16x16, the multiply-adds move from FFMA
// (the bound of register_tiled_gemm) to the tensor cores, an order of magnitude faster; what
// bounds this kernel is the gather into shared memory (one L1-mostly load, cvt and shared store
// per staged element, each feeding BLOCK_M MACs), which the column reuse trims by the cursor's
// ~8 integer operations per row and thread. Against wmma_16x16x16 expect most on conv1 (half the
// wasted tensor and weight work, a thinner weight tile) and about the same where M >= 16.
// Single-buffered; latency is hidden by resident blocks (9-18 KB of shared memory each).
// Precision: fp16 inputs and weights (|v| <= 65504), fp32 sums; within the fp16 tolerance 1e-2.
// Tunables: BLOCK_M (maps per block, multiple of 8), BLOCK_N (pixels per block, multiple of 32),
// WARPS (warps per block). The reduction chunk kBlockK = 32 (two k16 steps per barrier pair) is fixed.
#include <mma.h>

#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 8
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef WARPS
#define WARPS 2
#endif

using namespace nvcuda;

constexpr int kFragM = 8, kFragN = 32, kFragK = 16;  // the WMMA shape
constexpr int kBlockK = 32;
constexpr int kThreads = WARPS * 32;
constexpr int kWarpsN = WARPS < BLOCK_N / kFragN ? WARPS : BLOCK_N / kFragN;
constexpr int kWarpsM = WARPS / kWarpsN;
constexpr int kWarpFragsM = BLOCK_M / kFragM / kWarpsM;  // fragments per warp
constexpr int kWarpFragsN = BLOCK_N / kFragN / kWarpsN;
// Leading dimensions (elements). +8 halves = 16 bytes: the 8 rows a fragment load reads at once
// fall on distinct banks, and every fragment start stays 32-byte aligned as WMMA requires.
constexpr int kLdA = kBlockK + 8, kLdB = BLOCK_N + 8;
constexpr int kLdC = kFragN + 4;  // float scratch: a multiple of 4 floats
// The input tile loader: every thread loads every row of the chunk, kCols columns per row.
constexpr int kCols = BLOCK_N / kThreads;
constexpr int kAPerThread = BLOCK_M * kBlockK / kThreads;
// Shared memory: the two half tiles during the loop, then per-warp float scratch over them.
constexpr int kABytes = BLOCK_M * kLdA * 2;
constexpr int kBBytes = kBlockK * kLdB * 2;
constexpr int kScratchFloats = kFragM * kLdC;
constexpr int kTileBytes = kABytes + kBBytes;
constexpr int kScratchBytes = WARPS * kScratchFloats * 4;
constexpr int kSmemBytes = kTileBytes > kScratchBytes ? kTileBytes : kScratchBytes;

static_assert(BLOCK_M % kFragM == 0 && BLOCK_N % kFragN == 0, "the block tile must be whole fragments");
static_assert(WARPS % kWarpsN == 0 && (BLOCK_M / kFragM) % kWarpsM == 0, "warps must divide the fragments");
static_assert(BLOCK_N % kThreads == 0 && kCols >= 1, "each thread loads whole columns of the input tile");
static_assert(kBlockK % kFragK == 0, "fragments must divide kBlockK");
static_assert((BLOCK_M * kBlockK) % kThreads == 0, "the weight tile must split evenly over the threads");
static_assert(kABytes % 32 == 0 && (kScratchFloats * 4) % 32 == 0, "WMMA pointers must be 32-byte aligned");
static_assert(kSmemBytes <= 48 * 1024, "static shared memory is limited to 48 KB");

extern "C" __global__ void __launch_bounds__(kThreads) conv_forward(CONV_ARGS) {
    __shared__ __align__(32) unsigned char smem[kSmemBytes];
    __half (*a_tile)[kLdA] = reinterpret_cast<__half (*)[kLdA]>(smem);            // [BLOCK_M][kLdA]
    __half (*b_tile)[kLdB] = reinterpret_cast<__half (*)[kLdB]>(smem + kABytes);  // [kBlockK][kLdB]

    const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
    const int HW_out = H_out * W_out;
    const int N = B * HW_out;
    const int R = C * K * K;
    const int m0 = blockIdx.y * BLOCK_M, n0 = blockIdx.x * BLOCK_N;
    const int tid = threadIdx.x;

    // The window origins of this thread's columns tid, tid + kThreads, ...: decomposed once.
    const float *x_col[kCols];
    bool col_ok[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
        const int n = n0 + tid + j * kThreads;
        col_ok[j] = n < N;
        const int b = col_ok[j] ? n / HW_out : 0;
        const int hw = col_ok[j] ? n - b * HW_out : 0;
        const int h = hw / W_out, w = hw - h * W_out;
        x_col[j] = x + image_offset(b, C, H, W) + (h * S) * W + w * S;
    }
    RowCursor row(0, 1, K, H, W);  // every row, in order: one cursor step per row, shared by the columns

    const int warp = tid / 32, lane = tid % 32;
    const int wm = warp / kWarpsN, wn = warp % kWarpsN;
    wmma::fragment<wmma::accumulator, kFragM, kFragN, kFragK, float> acc[kWarpFragsM][kWarpFragsN];
#pragma unroll
    for (int i = 0; i < kWarpFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kWarpFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    for (int r0 = 0; r0 < R; r0 += kBlockK) {
        // Weights: consecutive threads read consecutive r of one map row (coalesced). They are
        // BLOCK_M / BLOCK_N of the staged elements and L2-resident, so scalar loads do.
#pragma unroll
        for (int u = 0; u < kAPerThread; ++u) {
            const int e = tid + u * kThreads;
            const int mm = e / kBlockK, kk = e % kBlockK;
            const int m = m0 + mm, r = r0 + kk;
            a_tile[mm][kk] = __float2half(m < M && r < R ? k[m * R + r] : 0.f);
        }
#pragma unroll
        for (int kk = 0; kk < kBlockK; ++kk) {
            const bool row_ok = row.r < R;
#pragma unroll
            for (int j = 0; j < kCols; ++j)
                b_tile[kk][tid + j * kThreads] = __float2half(row_ok && col_ok[j] ? x_col[j][row.off] : 0.f);
            row.advance(1, K, H, W);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBlockK; kk += kFragK) {
            wmma::fragment<wmma::matrix_a, kFragM, kFragN, kFragK, __half, wmma::row_major> a[kWarpFragsM];
#pragma unroll
            for (int i = 0; i < kWarpFragsM; ++i)
                wmma::load_matrix_sync(a[i], &a_tile[(wm * kWarpFragsM + i) * kFragM][kk], kLdA);
#pragma unroll
            for (int j = 0; j < kWarpFragsN; ++j) {
                wmma::fragment<wmma::matrix_b, kFragM, kFragN, kFragK, __half, wmma::row_major> v;
                wmma::load_matrix_sync(v, &b_tile[kk][(wn * kWarpFragsN + j) * kFragN], kLdB);
#pragma unroll
                for (int i = 0; i < kWarpFragsM; ++i) wmma::mma_sync(acc[i][j], a[i], v, acc[i][j]);
            }
        }
        __syncthreads();  // also: every warp is done with the tiles before the scratch reuses them
    }

    // Epilogue, per warp and fragment: lane owns column `lane`, so each store is 32 consecutive
    // pixels of one map.
    float *scratch = reinterpret_cast<float *>(smem) + warp * kScratchFloats;  // [kFragM][kLdC]
#pragma unroll
    for (int j = 0; j < kWarpFragsN; ++j) {
        const int n = n0 + (wn * kWarpFragsN + j) * kFragN + lane;
        const bool n_ok = n < N;
        const int b = n_ok ? n / HW_out : 0;
        const int hw = n_ok ? n - b * HW_out : 0;
        float *y_col = y + image_offset(b, M, H_out, W_out) + hw;
#pragma unroll
        for (int i = 0; i < kWarpFragsM; ++i) {
            const int m_frag = m0 + (wm * kWarpFragsM + i) * kFragM;
            if (m_frag >= M) continue;  // warp-uniform: a fragment of padding maps only
            wmma::store_matrix_sync(scratch, acc[i][j], kLdC, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int t = 0; t < kFragM; ++t) {
                const int m = m_frag + t;
                if (n_ok && m < M) y_col[m * HW_out] = scratch[t * kLdC + lane] + bias[m];
            }
            __syncwarp();  // reads done before the next fragment overwrites the scratch
        }
    }
}
