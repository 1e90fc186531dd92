// register_tiled_gemm: the implicit GEMM of fused_gemm (Y[m, n] = sum_r Kmat[m, r] * X[r, n],
// r = (c, p, q), n = (b, h, w) with the batch in N, X gathered from x while staging, never
// stored) with register blocking: each thread computes a THREAD_M x THREAD_N block of outputs
// held in registers, from a BLOCK_M x BLOCK_N block tile and BLOCK_K-deep shared-memory chunks.
// Expected gain over fused_gemm: per reduction step a thread reads THREAD_M weights and THREAD_N
// inputs from shared memory and does THREAD_M * THREAD_N FMAs with them (8x8: 16 loads per 64
// FMAs instead of 2 per 1), as 16-byte LDS.128 reads when THREAD_M / THREAD_N are multiples of 4,
// so the kernel moves from shared-memory bound towards FMA bound; fewer, fatter threads also
// spend less on index arithmetic and barriers per output.
// Layout: the weight tile is stored transposed, k_tile[r][m] (padded by 4 floats so transposed
// stores spread over banks while rows stay 16-byte aligned); a thread owns maps and pixels in
// groups of 4 consecutive ones (1 when not a multiple of 4), the groups strided by the thread
// grid, so a warp's shared reads are consecutive 16-byte words and its stores stay coalesced.
// Global loads: weight rows are R = C*K*K floats, so a weight row start is 16-byte aligned only
// when R % 4 == 0 and k itself is; that is checked at run time (uniform over the grid) and the
// tile is then fetched as float4, else as scalars. The input gather is scalar: consecutive
// pixels are S floats apart and cross row and image ends, so no alignment holds in general.
// The input tile is gathered as in fused_gemm (implicit_gemm.cuh): column origins decomposed
// once, row offsets advanced by a RowCursor. Edges: rows past R, maps past M and pixels past N
// load zeros and store nothing; every thread reaches every barrier.
// Launch: 1-D block of (BLOCK_M / THREAD_M) * (BLOCK_N / THREAD_N) threads,
// grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M)).
// Tunables: BLOCK_M, BLOCK_N (block tile), BLOCK_K (reduction chunk), THREAD_M, THREAD_N
// (register tile per thread).
#include "implicit_gemm.cuh"

#ifndef BLOCK_M
#define BLOCK_M 16
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef BLOCK_K
#define BLOCK_K 16
#endif
#ifndef THREAD_M
#define THREAD_M 4
#endif
#ifndef THREAD_N
#define THREAD_N 8
#endif

constexpr int kThreadsM = BLOCK_M / THREAD_M, kThreadsN = BLOCK_N / THREAD_N;
constexpr int kThreads = kThreadsM * kThreadsN;
constexpr int kVecM = THREAD_M % 4 == 0 ? 4 : 1;  // consecutive maps per group a thread owns
constexpr int kVecN = THREAD_N % 4 == 0 ? 4 : 1;  // consecutive pixels per group
constexpr int kPadM = 4;                          // keeps k_tile rows 16-byte aligned
using Gather = GatherShape<kThreads, BLOCK_N, BLOCK_K>;
constexpr int kColThreads = Gather::kColThreads, kCols = Gather::kCols, kLoadRows = Gather::kLoadRows;

static_assert(BLOCK_M % THREAD_M == 0 && BLOCK_N % THREAD_N == 0, "thread tiles must divide the block tile");
static_assert(kThreads >= 32 && kThreads <= 1024, "threads per block must lie in [32, 1024]");
static_assert(BLOCK_K % 4 == 0, "BLOCK_K must be a multiple of 4 (float4 weight loads)");
static_assert(4 * BLOCK_K * (BLOCK_M + kPadM + BLOCK_N) <= 48 * 1024, "tiles exceed 48 KB of shared memory");

// The i-th map / j-th pixel of a thread's register tile, relative to the block tile.
__device__ __forceinline__ int tile_m(int ty, int i) { return (ty + (i / kVecM) * kThreadsM) * kVecM + i % kVecM; }
__device__ __forceinline__ int tile_n(int tx, int j) { return (tx + (j / kVecN) * kThreadsN) * kVecN + j % kVecN; }

extern "C" __global__ void __launch_bounds__(kThreads) conv_forward(CONV_ARGS) {
    __shared__ __align__(16) float k_tile[BLOCK_K][BLOCK_M + kPadM];
    __shared__ __align__(16) float x_tile[BLOCK_K][BLOCK_N];

    const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
    const int HW_out = H_out * W_out;
    const int N = B * HW_out;
    const int R = C * K * K;
    const int m0 = blockIdx.y * BLOCK_M, n0 = blockIdx.x * BLOCK_N;
    const int tid = threadIdx.x;
    const int tx = tid % kThreadsN, ty = tid / kThreadsN;

    // Input loader: window origins of this thread's tile columns, decomposed once.
    const int lx = tid % kColThreads, ly = tid / kColThreads;
    const float *x_col[kCols];
    bool col_ok[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
        const int n = n0 + lx + j * kColThreads;
        col_ok[j] = n < N;
        x_col[j] = column_origin(x, n, col_ok[j], HW_out, W_out, C, H, W, S);
    }
    RowCursor row(ly, kLoadRows, K, H, W);
    const bool loads_x = ly < kLoadRows;
    const bool k_vec = R % 4 == 0 && (reinterpret_cast<size_t>(k) & 15) == 0;

    float acc[THREAD_M][THREAD_N];
#pragma unroll
    for (int i = 0; i < THREAD_M; ++i)
#pragma unroll
        for (int j = 0; j < THREAD_N; ++j) acc[i][j] = 0.f;

    for (int r0 = 0; r0 < R; r0 += BLOCK_K) {
        if (k_vec) {  // R % 4 == 0 and r0 + kk % 4 == 0: a quad is either all inside R or all past it
            for (int u = tid; u < BLOCK_M * BLOCK_K / 4; u += kThreads) {
                const int mm = u / (BLOCK_K / 4), kk = (u % (BLOCK_K / 4)) * 4;
                const int m = m0 + mm, r = r0 + kk;
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if (m < M && r < R) v = *reinterpret_cast<const float4 *>(k + m * R + r);
                k_tile[kk][mm] = v.x;
                k_tile[kk + 1][mm] = v.y;
                k_tile[kk + 2][mm] = v.z;
                k_tile[kk + 3][mm] = v.w;
            }
        } else {
            for (int e = tid; e < BLOCK_M * BLOCK_K; e += kThreads) {
                const int mm = e / BLOCK_K, kk = e % BLOCK_K;
                const int m = m0 + mm, r = r0 + kk;
                k_tile[kk][mm] = (m < M && r < R) ? k[m * R + r] : 0.f;
            }
        }
        if (loads_x) {
#pragma unroll
            for (int pass = 0; pass < BLOCK_K / kLoadRows; ++pass) {
                const bool row_ok = row.r < R;
#pragma unroll
                for (int j = 0; j < kCols; ++j)
                    x_tile[ly + pass * kLoadRows][lx + j * kColThreads] = (row_ok && col_ok[j]) ? x_col[j][row.off] : 0.f;
                row.advance(kLoadRows, K, H, W);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BLOCK_K; ++kk) {
            float a[THREAD_M], v[THREAD_N];
#pragma unroll
            for (int g = 0; g < THREAD_M / kVecM; ++g) {
                if constexpr (kVecM == 4) {
                    const float4 t = *reinterpret_cast<const float4 *>(&k_tile[kk][tile_m(ty, 4 * g)]);
                    a[4 * g] = t.x, a[4 * g + 1] = t.y, a[4 * g + 2] = t.z, a[4 * g + 3] = t.w;
                } else {
                    a[g] = k_tile[kk][tile_m(ty, g)];
                }
            }
#pragma unroll
            for (int g = 0; g < THREAD_N / kVecN; ++g) {
                if constexpr (kVecN == 4) {
                    const float4 t = *reinterpret_cast<const float4 *>(&x_tile[kk][tile_n(tx, 4 * g)]);
                    v[4 * g] = t.x, v[4 * g + 1] = t.y, v[4 * g + 2] = t.z, v[4 * g + 3] = t.w;
                } else {
                    v[g] = x_tile[kk][tile_n(tx, g)];
                }
            }
#pragma unroll
            for (int i = 0; i < THREAD_M; ++i)
#pragma unroll
                for (int j = 0; j < THREAD_N; ++j) acc[i][j] = fmaf(a[i], v[j], acc[i][j]);
        }
        __syncthreads();
    }

    float bias_of[THREAD_M];
#pragma unroll
    for (int i = 0; i < THREAD_M; ++i) {
        const int m = m0 + tile_m(ty, i);
        bias_of[i] = m < M ? bias[m] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < THREAD_N; ++j) {
        const int n = n0 + tile_n(tx, j);
        if (n < N) {
            const int b = n / HW_out, hw = n - b * HW_out;
            float *y_col = y + image_offset(b, M, H_out, W_out) + hw;
#pragma unroll
            for (int i = 0; i < THREAD_M; ++i) {
                const int m = m0 + tile_m(ty, i);
                if (m < M) y_col[m * HW_out] = acc[i][j] + bias_of[i];
            }
        }
    }
}
