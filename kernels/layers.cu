// The network's other layers on the GPU (not variants: they are the same for every sweep).
// relu and maxpool are one thread per output; dense tiles images (below).
// conv_t is float, or double for float64 networks (common.cuh).
#include "common.cuh"

extern "C" __global__ void relu_inplace(conv_t *__restrict__ x, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n && x[i] < conv_t(0)) x[i] = conv_t(0);  // NaN stays NaN: poisoned outputs must show
}

// y[b][c][h][w] = max over a size x size window at stride `stride` (floor mode).
extern "C" __global__ void maxpool2d(conv_t *__restrict__ y, const conv_t *__restrict__ x, int BC,
                                     int H, int W, int size, int stride) {
    const int H_out = (H - size) / stride + 1, W_out = (W - size) / stride + 1;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)BC * H_out * W_out) return;
    const int w = i % W_out, h = (i / W_out) % H_out;
    const long long bc = i / ((long long)W_out * H_out);
    const conv_t *plane = x + bc * H * W + (long long)h * stride * W + w * stride;
    conv_t m = plane[0];
    for (int p = 0; p < size; ++p)
        for (int q = 0; q < size; ++q) {
            const conv_t v = plane[p * W + q];
            m = (v > m || v != v) ? v : m;  // propagates NaN, unlike fmax
        }
    y[i] = m;
}

// y[b][j] = bias[j] + sum_i x[b][i] * w[j][i], then ReLU when `relu` (a following relu layer, fused
// by the runner): a register-tiled GEMM. A block computes DENSE_TILE_B images x DENSE_TILE_N
// outputs; its two halves take alternate DENSE_TILE_K-wide slices of k (staged in shared memory,
// one buffer per half) and add up at the end. A thread owns 2 images x 4 outputs, so each shared
// load feeds 2-4 FMAs, and loads its next slice into registers while it computes on this one.
// Why: the kernel before it (a warp per output, lanes along i) did one shared load per FMA, 77 us
// for LeNet-86's fc1 (B=10000, 1024 -> 32) on an H100; with one half per block, 313 blocks of 4
// warps filled 0.6 waves and waited on latency (ncu: 9.6 warps per SM, issue slots 33%), 57 us.
// Rows are DENSE_TILE_K + 4 apart: a warp's 4 image rows and 8 output rows fall in distinct
// banks, and loads along k vectorize.
#define DENSE_TILE_B 32
#define DENSE_TILE_N 32
#define DENSE_TILE_K 32
#define DENSE_HALF 128                // threads per k half
#define DENSE_THREADS (2 * DENSE_HALF)  // runner._DENSE_THREADS, _DENSE_TILE

extern "C" __global__ void __launch_bounds__(DENSE_THREADS)
dense(conv_t *__restrict__ y, const conv_t *__restrict__ x, const conv_t *__restrict__ w,
      const conv_t *__restrict__ bias, int B, int in_features, int out_features, int relu) {
    static_assert(DENSE_TILE_B == DENSE_TILE_N, "one loop stages both tiles");
    constexpr int LD = DENSE_TILE_K + 4, ROW_STEP = DENSE_HALF / DENSE_TILE_K, ROWS = DENSE_TILE_B / ROW_STEP;
    __shared__ __align__(16) conv_t xs[2][DENSE_TILE_B][LD];
    __shared__ __align__(16) conv_t ws[2][DENSE_TILE_N][LD];
    const int half = threadIdx.x / DENSE_HALF, t = threadIdx.x % DENSE_HALF;
    const int tx = t % 8, ty = t / 8;  // outputs j0 + tx + 8c, images b0 + ty + 16a
    const int b0 = blockIdx.x * DENSE_TILE_B, j0 = blockIdx.y * DENSE_TILE_N;
    // Staging: this thread's column kk0 of rows r0 + l * ROW_STEP of both tiles (lanes along k: coalesced).
    const int kk0 = t % DENSE_TILE_K, r0 = t / DENSE_TILE_K;
    const conv_t *xp = x + (long long)(b0 + r0) * in_features + kk0, *wp = w + (long long)(j0 + r0) * in_features + kk0;
    const long long step = (long long)ROW_STEP * in_features;
    conv_t xn[ROWS], wn[ROWS];  // this half's next slice
    auto fetch = [&](int k0) {
        const bool k_ok = k0 + kk0 < in_features;
#pragma unroll
        for (int l = 0; l < ROWS; ++l) {
            xn[l] = k_ok && b0 + r0 + l * ROW_STEP < B ? xp[l * step + k0] : conv_t(0);
            wn[l] = k_ok && j0 + r0 + l * ROW_STEP < out_features ? wp[l * step + k0] : conv_t(0);
        }
    };
    conv_t acc[2][4] = {};
    fetch(half * DENSE_TILE_K);
    // Both halves run the same iterations (a slice past in_features stages zeros): the barriers match.
    const int iterations = (in_features + 2 * DENSE_TILE_K - 1) / (2 * DENSE_TILE_K);
    for (int it = 0; it < iterations; ++it) {
        __syncthreads();  // the previous slice is consumed
#pragma unroll
        for (int l = 0; l < ROWS; ++l) {
            xs[half][r0 + l * ROW_STEP][kk0] = xn[l];
            ws[half][r0 + l * ROW_STEP][kk0] = wn[l];
        }
        __syncthreads();
        if (it + 1 < iterations) fetch((2 * (it + 1) + half) * DENSE_TILE_K);
#pragma unroll
        for (int kk = 0; kk < DENSE_TILE_K; ++kk) {
            conv_t xv[2], wv[4];
#pragma unroll
            for (int a = 0; a < 2; ++a) xv[a] = xs[half][ty + 16 * a][kk];
#pragma unroll
            for (int c = 0; c < 4; ++c) wv[c] = ws[half][tx + 8 * c][kk];
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[a][c] += xv[a] * wv[c];
        }
    }
    // The second half's sums go through its (consumed) x buffer to the first half.
    conv_t *partial = &xs[1][0][0];
    __syncthreads();
    if (half == 1) {
#pragma unroll
        for (int e = 0; e < 8; ++e) partial[e * DENSE_HALF + t] = acc[e / 4][e % 4];
    }
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int b = b0 + ty + 16 * a, j = j0 + tx + 8 * c;
            if (b >= B || j >= out_features) continue;
            const conv_t v = acc[a][c] + partial[(a * 4 + c) * DENSE_HALF + t] + bias[j];
            y[(long long)b * out_features + j] = relu && v < conv_t(0) ? conv_t(0) : v;  // NaN stays NaN
        }
}
