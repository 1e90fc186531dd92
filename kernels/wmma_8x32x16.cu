// wmma_8x32x16: the tensor-core implicit GEMM of wmma_16x16x16 (Y[m, n] = sum_r Kmat[m, r] *
// X[r, n], r = (c, p, q) over R = C*K*K, n = (b, h, w) over N = B*H_out*W_out, batch in N; fp16
// operands staged in shared memory, fp32 accumulators, bias added in a per-warp float scratch:
// the kernel of wmma_gemm.cuh) with the fragment shape m8n32k16: A = weights, 8 maps x 16 rows;
// B = gathered input, 16 rows x 32 pixels.
// Why this shape: the maps are the short side of these GEMMs. LeNet conv1 has M = 4, so a 16-row
// fragment wastes 3/4 of every mma and of the weight staging, an 8-row one half; conv2 (M = 16)
// is two 8-row fragments with no waste. The 32-pixel side also makes every epilogue store one
// 128-byte row of 32 consecutive outputs of one map.
// Index reuse in the gather (kEveryRow): a block has fewer threads than BLOCK_N columns
// (BLOCK_N >= 64 * WARPS), so every thread loads every row of a chunk, kCols = BLOCK_N /
// (32 * WARPS) >= 2 columns of each. The columns' window origins (b, h*S, w*S) are decomposed
// once per thread; the row's (c, p, q) and its offset c*H*W + p*W + q are kept by a RowCursor
// (additions, no division), advanced once per row and reused by all kCols columns, so the
// per-element work of the gather is a predicated load, a cvt and a 16-bit shared store.
// Consecutive threads hold consecutive columns (the columns of a thread are kThreads apart), so
// a warp's loads are consecutive pixels.
// Mapping: warps spread over N first (kWarpsN = min(WARPS, BLOCK_N / 32)), then M; each warp owns
// kWarpFragsM x kWarpFragsN fragments of 8 x 32 outputs.
// Expected gain over register_tiled_gemm: as wmma_16x16x16, the multiply-adds move from FFMA
// (the bound of register_tiled_gemm) to the tensor cores, an order of magnitude faster; what
// bounds this kernel is the gather into shared memory (one L1-mostly load, cvt and shared store
// per staged element, each feeding BLOCK_M MACs), which the column reuse trims by the cursor's
// ~8 integer operations per row and thread. Against wmma_16x16x16 expect most on conv1 (half the
// wasted tensor and weight work, a thinner weight tile) and about the same where M >= 16.
// Single-buffered; latency is hidden by resident blocks (9-18 KB of shared memory each).
// Precision: fp16 inputs and weights (|v| <= 65504), fp32 sums; within the fp16 tolerance 1e-2.
// Tunables: BLOCK_M (maps per block, multiple of 8), BLOCK_N (pixels per block, multiple of 32),
// WARPS (warps per block). The reduction chunk kBlockK = 32 is fixed (wmma_gemm.cuh).
#include "wmma_gemm.cuh"

#ifndef BLOCK_M
#define BLOCK_M 8
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef WARPS
#define WARPS 2
#endif

using Conv = WmmaConv<8, 32, 16, BLOCK_M, BLOCK_N, WARPS, /*kEveryRow=*/true>;

extern "C" __global__ void __launch_bounds__(Conv::kThreads) conv_forward(CONV_ARGS) {
    Conv::run(y, x, k, bias, B, C, M, H, W, K, S);
}
