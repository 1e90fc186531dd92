// fused_gemm: implicit GEMM. The conv is the matrix product Y[m, n] = sum_r Kmat[m, r] * X[r, n]
// with r = (c, p, q) over C*K*K and n = (b, h, w) over B*H_out*W_out: the batch is part of N, so
// layers with few maps (M = 4, 16) still launch millions of columns. The unrolled matrix X is
// never written: each block stages a TILE_R x TILE_N slice of it in shared memory straight from
// x (the im2col gather fused into the tile load), beside the TILE_M x TILE_R weight tile, and
// every thread computes one output from the two tiles.
// Expected gain over naive: an input value staged once serves TILE_M maps and a weight serves
// TILE_N outputs from shared memory, instead of every thread fetching all C*K*K operand pairs
// through L1/L2; what remains is one shared-memory load pair per FMA (a broadcast weight and a
// conflict-free input), which the register-tiled variant attacks next.
// Index arithmetic: a thread loads the same tile column in every chunk, so its column's window
// origin (b, h*S, w*S) is decomposed once; the rows it loads advance by a constant step, so
// their (c, p, q) offsets are carried by a RowCursor with additions instead of divisions.
// Edges: rows past R, maps past M and columns past N load zeros and store nothing; every thread
// reaches every barrier. Launch: block (TILE_N, TILE_M), grid (ceil(N / TILE_N), ceil(M / TILE_M)).
// Tunables: TILE_M (maps per block), TILE_N (output pixels per block), TILE_R (reduction chunk).
#include "common.cuh"

#ifndef TILE_M
#define TILE_M 16
#endif
#ifndef TILE_N
#define TILE_N 64
#endif
#ifndef TILE_R
#define TILE_R 16
#endif

constexpr int kThreads = TILE_M * TILE_N;
// The input tile is loaded TILE_N threads per row, TILE_M rows per pass (fewer when TILE_R is
// smaller); each thread's rows are then a constant LOAD_ROWS apart across the whole reduction.
constexpr int kLoadRows = TILE_M < TILE_R ? TILE_M : TILE_R;

static_assert(kThreads <= 1024, "TILE_M * TILE_N must not exceed 1024 threads");
static_assert(TILE_R % kLoadRows == 0, "TILE_R and TILE_M must divide one another");
static_assert(TILE_N >= TILE_R, "the weight tile is loaded by one row of TILE_N threads per map");
static_assert(4 * (TILE_M * TILE_R + TILE_R * TILE_N) <= 48 * 1024, "tiles exceed 48 KB of shared memory");

extern "C" __global__ void __launch_bounds__(kThreads) conv_forward(CONV_ARGS) {
    __shared__ float k_tile[TILE_M][TILE_R];
    __shared__ float x_tile[TILE_R][TILE_N];

    const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
    const int HW_out = H_out * W_out;
    const int N = B * HW_out;
    const int R = C * K * K;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int m = blockIdx.y * TILE_M + ty;
    const int n = blockIdx.x * TILE_N + tx;

    // This thread's column: computed into and loaded by it, decomposed once.
    const bool n_ok = n < N;
    const int b = n_ok ? n / HW_out : 0;
    const int hw = n_ok ? n - b * HW_out : 0;
    const int h = hw / W_out, w = hw - h * W_out;
    const float *x_col = x + image_offset(b, C, H, W) + (h * S) * W + w * S;

    RowCursor row(ty, kLoadRows, K, H, W);  // this thread's input-tile rows: ty, ty + kLoadRows, ...
    float acc = 0.f;
    for (int r0 = 0; r0 < R; r0 += TILE_R) {
        if (tx < TILE_R) {
            const int r = r0 + tx;
            k_tile[ty][tx] = (m < M && r < R) ? k[m * R + r] : 0.f;  // row ty: this thread's map
        }
        if (ty < kLoadRows) {
#pragma unroll
            for (int j = 0; j < TILE_R / kLoadRows; ++j) {
                x_tile[ty + j * kLoadRows][tx] = (n_ok && row.r < R) ? x_col[row.off] : 0.f;
                row.advance(kLoadRows, K, H, W);
            }
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < TILE_R; ++rr) acc += k_tile[ty][rr] * x_tile[rr][tx];
        __syncthreads();
    }
    if (m < M && n_ok) y[image_offset(b, M, H_out, W_out) + m * HW_out + hw] = acc + bias[m];
}
