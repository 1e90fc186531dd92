// im2col_gemm: explicit im2col, then a classic shared-memory tiled matrix multiply. The conv is
// the GEMM Y[m, n] = bias[m] + sum_r Kmat[m, r] * X[r, n] with Kmat = k viewed as [M][R],
// r = c*K*K + p*K + q (R = C*K*K) and n = b*H_out*W_out + h*W_out + w (N = B*H_out*W_out, the
// batch in N). Unlike fused_gemm / register_tiled_gemm, X is materialised:
//   1. im2col_unroll writes X (float, [R][N] row-major) into the workspace;
//   2. im2col_gemm_tiled multiplies Kmat by X and writes y in NCHW.
// This is the textbook route (GEMM on a precomputed unrolled matrix, as Caffe did), kept as the
// baseline that shows what materialising X costs: X is about K*K/S^2 times the input (49x for a 7x7
// stride-1 conv), written to DRAM once and read back ceil(M / TILE) times (once per row of
// blocks). LeNet conv1 at B=10000: X is 4*R*N = 12.5 GB (R=49, N=64e6), so >= 25 GB of DRAM
// traffic against 1.3 GB of compulsory x and y traffic; at ~3.35 TB/s (H100) that bounds it
// at >= ~7.5 ms, well behind the implicit GEMMs, whose gather stays on chip. What it buys is a
// regular GEMM: no index arithmetic in the inner loop, fully coalesced X loads.
// Mapping:
//   im2col_unroll: thread = column n (block of 256 along n, so a warp writes 128 contiguous
//     bytes of one row of X); blockIdx.y picks rows r = blockIdx.y, blockIdx.y + gridDim.y, ...
//     (the registry sets gridDim.y = min(R, 16), so any R works), walked by a RowCursor.
//   im2col_gemm_tiled: block (TILE, TILE) = (tx along n, ty along m) computes a TILE x
//     (TILE*COARSEN) tile of Y; grid (ceil(N / (TILE*COARSEN)), ceil(M / TILE)). Thread (ty, tx)
//     owns outputs m = m0 + ty, n = n0 + tx + j*TILE (j < COARSEN): stores stay coalesced along n.
//     Per TILE-deep chunk of r, the block stages a TILE x TILE tile of Kmat and a TILE x
//     TILE*COARSEN tile of X in shared memory.
// Small M (LeNet: 4 and 16 maps) leaves rows of the m-tile idle; that is the price of the
// square classic tiling, and TILE = 8 limits it.
// Indices: X offsets are 64-bit (R*N passes 2^31); n, m, r and offsets inside one image are
// 32-bit (the registry constraints keep N + 256 and M*R below 2^31).
// Tunables: TILE (square tile edge and block edge), COARSEN (outputs per thread along n).
#include "common.cuh"

#ifndef TILE
#define TILE 16
#endif
#ifndef COARSEN
#define COARSEN 1
#endif

#define UNROLL_BLOCK 256  // im2col_unroll threads per block; the registry's grid.x divides by it

static_assert(TILE * TILE <= 1024, "TILE x TILE threads per block");
static_assert(4 * TILE * TILE * (1 + COARSEN) <= 48 * 1024, "tiles exceed 48 KB of shared memory");

extern "C" __global__ void __launch_bounds__(UNROLL_BLOCK) im2col_unroll(CONV_ARGS, WORKSPACE_ARG) {
    const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
    const int HW_out = H_out * W_out;
    const int N = B * HW_out;
    const int R = C * K * K;
    const int n = blockIdx.x * UNROLL_BLOCK + threadIdx.x;
    if (n >= N || (int)blockIdx.y >= R) return;  // no barriers here

    const int b = n / HW_out, hw = n - b * HW_out;
    const int h = hw / W_out, w = hw - h * W_out;
    const float *x_col = x + image_offset(b, C, H, W) + (h * S) * W + w * S;  // window origin

    const int step = gridDim.y;
    RowCursor row(blockIdx.y, step, K, H, W);
    float *out = static_cast<float *>(workspace) + (long long)row.r * N + n;
    const long long out_step = (long long)step * N;
    for (; row.r < R; row.advance(step, K, H, W), out += out_step) *out = x_col[row.off];
}

extern "C" __global__ void __launch_bounds__(TILE *TILE) im2col_gemm_tiled(CONV_ARGS, WORKSPACE_ARG) {
    __shared__ float k_tile[TILE][TILE];            // [m][r]
    __shared__ float x_tile[TILE][TILE * COARSEN];  // [r][n]

    const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
    const int HW_out = H_out * W_out;
    const int N = B * HW_out;
    const int R = C * K * K;
    const float *X = static_cast<const float *>(workspace);
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int m = blockIdx.y * TILE + ty;
    const int n0 = blockIdx.x * (TILE * COARSEN) + tx;  // this thread's first column

    float acc[COARSEN];
#pragma unroll
    for (int j = 0; j < COARSEN; ++j) acc[j] = 0.f;

    for (int r0 = 0; r0 < R; r0 += TILE) {
        // Loads: a warp reads consecutive r of one Kmat row and consecutive n of one X row.
        // Rows past R, maps past M and columns past N read as zero; every thread reaches the barriers.
        const int rk = r0 + tx;
        k_tile[ty][tx] = (m < M && rk < R) ? k[m * R + rk] : 0.f;
        const int rx = r0 + ty;
        const float *x_row = X + (long long)rx * N;
#pragma unroll
        for (int j = 0; j < COARSEN; ++j) {
            const int n = n0 + j * TILE;
            x_tile[ty][tx + j * TILE] = (rx < R && n < N) ? x_row[n] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) {
            const float a = k_tile[ty][kk];  // broadcast along tx
#pragma unroll
            for (int j = 0; j < COARSEN; ++j) acc[j] = fmaf(a, x_tile[kk][tx + j * TILE], acc[j]);
        }
        __syncthreads();
    }

    if (m >= M) return;
    const float bias_m = bias[m];
#pragma unroll
    for (int j = 0; j < COARSEN; ++j) {
        const int n = n0 + j * TILE;
        if (n < N) {
            const int b = n / HW_out, hw = n - b * HW_out;
            y[image_offset(b, M, H_out, W_out) + m * HW_out + hw] = acc[j] + bias_m;
        }
    }
}
