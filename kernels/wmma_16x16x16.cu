// wmma_16x16x16: the implicit GEMM of register_tiled_gemm (Y[m, n] = sum_r Kmat[m, r] * X[r, n],
// r = (c, p, q) over R = C*K*K, n = (b, h, w) over N = B*H_out*W_out, batch in N) on the tensor
// cores through WMMA: fp16 operands, fp32 accumulators, fragment shape m16n16k16. The kernel
// (staging, fragment loop, epilogue) is wmma_gemm.cuh's; this file picks the shape and the gather.
// Gather: the threads of a block are split into groups of kColThreads = min(threads, BLOCK_N)
// across a tile row, each group staging every kLoadRows-th row of a chunk (implicit_gemm.cuh).
// Mapping: the warps are spread over N first (kWarpsN = min(WARPS, BLOCK_N / 16)), then M, and
// each warp owns a kWarpFragsM x kWarpFragsN block of 16x16 output fragments; in the epilogue a
// store covers 16 consecutive pixels of two maps.
// Expected gain over register_tiled_gemm: that kernel is FMA bound, one FFMA per multiply-add
// (an H100 SM issues 128 FFMA per clock); the tensor cores do an order of magnitude more fp16
// MACs (dense fp16 ~990 TFLOPS vs ~67 fp32; mma.sync reaches a good part of that), so the
// arithmetic becomes nearly free, and fp16 halves the tiles' shared-memory footprint. What bounds
// it then is the gather into shared memory: per chunk a thread stages kBlockK / kLoadRows * kCols
// input elements, each a scalar predicated load of x (mostly L1 hits: a value is reused by K*K
// neighbouring windows), a cvt and a 16-bit shared store, plus a RowCursor step per row; each
// staged element feeds BLOCK_M multiply-adds, on which register_tiled_gemm spends BLOCK_M FFMAs.
// Expect several x on LeNet conv2 (M = 16: 16 MACs per staged value) and little on conv1
// (M = 4: 3/4 of every 16-row fragment is zero padding, and 4 FFMAs per staged value were cheap
// already); the 256-map conv256 layer is where the tensor cores matter most (BLOCK_M = 64).
// Single-buffered; latency is hidden by resident blocks (6-14 KB of shared memory each).
// Precision: inputs and weights rounded to fp16 (11-bit significand, |v| <= 65504), products
// summed in fp32: normwise error ~1e-4 to 1e-3, within the fp16 tolerance 1e-2.
// Tunables: BLOCK_M (maps per block, multiple of 16), BLOCK_N (pixels per block, multiple of 16),
// WARPS (warps per block). The reduction chunk kBlockK = 32 is fixed (wmma_gemm.cuh).
#include "wmma_gemm.cuh"

#ifndef BLOCK_M
#define BLOCK_M 16
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef WARPS
#define WARPS 4
#endif

using Conv = WmmaConv<16, 16, 16, BLOCK_M, BLOCK_N, WARPS, /*kEveryRow=*/false>;

extern "C" __global__ void __launch_bounds__(Conv::kThreads) conv_forward(CONV_ARGS) {
    Conv::run(y, x, k, bias, B, C, M, H, W, K, S);
}
