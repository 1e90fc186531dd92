// The input-tile gather of the register-tiled and tensor-core implicit GEMMs (register_tiled_gemm,
// wmma_gemm.cuh). The conv is Y[m, n] = sum_r Kmat[m, r] * X[r, n] with r = (c, p, q) over
// R = C*K*K and n = (b, h, w) over N = B*H_out*W_out (the batch in N); X is never stored: each
// kTileK x kTileN tile of it is gathered from x straight into shared memory.
// A block of kThreads threads loads the tile kColThreads threads across a row, each thread kCols
// columns kColThreads apart (a warp's loads are consecutive pixels), kLoadRows rows per pass; a
// thread's rows are then a constant kLoadRows apart across the whole reduction, so one RowCursor
// (common.cuh) walks them with additions, and its columns' window origins are decomposed once
// (column_origin). Rows past R and columns past N load zeros.
// The column arrays and the staging loop stay in the kernel functions: handing the arrays to an
// inlined helper, packing them in a struct, or moving a loop into a helper changes the order in
// which NVVM numbers the kernel's registers, and ptxas then emits different code for some builds;
// a helper on scalars without loops (column_origin) leaves the machine code as it was.
#pragma once

#include "common.cuh"

template <int kThreads, int kTileN, int kTileK>
struct GatherShape {
    static constexpr int kColThreads = kThreads < kTileN ? kThreads : kTileN;
    static constexpr int kCols = kTileN / kColThreads;
    static constexpr int kRowsPerPass = kThreads / kColThreads;
    static constexpr int kLoadRows = kRowsPerPass < kTileK ? kRowsPerPass : kTileK;
    static_assert(kTileN % kColThreads == 0 && kThreads % kColThreads == 0,
                  "loader threads must divide the tile width");
    static_assert(kTileK % kLoadRows == 0, "loader rows per pass must divide the chunk depth");
};

// The window origin (b, h*S, w*S) in x of column n; x itself when n is past N (ok false), so the
// pointer stays inside x.
__device__ __forceinline__ const float *column_origin(const float *x, int n, bool ok, int HW_out, int W_out, int C,
                                                      int H, int W, int S) {
    const int b = ok ? n / HW_out : 0;
    const int hw = ok ? n - b * HW_out : 0;
    const int h = hw / W_out, w = hw - h * W_out;
    return x + image_offset(b, C, H, W) + (h * S) * W + w * S;
}
