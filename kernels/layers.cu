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

// y[b][j] = bias[j] + sum_i x[b][i] * w[j][i], one block per tile of `imgs` consecutive images.
// Why: one warp per (image, output) re-read the image's row for every output; LeNet-86's fc1
// (B=10000, 1024 -> 32) read its 41 MB input 32 times, and fc1+relu3+fc2 took ~0.15 ms of a
// 1.25 ms forward pass on an H100. Here the tile's rows go to shared memory once, then warps take
// outputs j round-robin: lanes stride over i, so each coalesced load of w[j][i] feeds imgs FMAs
// from shared memory, and each image's 32 partial sums meet in an xor-shuffle tree (every lane
// ends with the sum; lane t writes image t). Bounds: one shared-memory load per FMA, and every
// block re-reads all of w from L2 (fc1: 128 KB per 8 images). The runner picks imgs so the tile
// fits 48 KB (at least one image), so fp64_stride5's 4000-double rows get one image per block and
// its 320 KB of weights are read once per image.
#define DENSE_MAX_IMGS 8  // accumulators per lane (<= 32: lane t writes image t); runner._DENSE_MAX_IMGS

extern "C" __global__ void dense(conv_t *__restrict__ y, const conv_t *__restrict__ x,
                                 const conv_t *__restrict__ w, const conv_t *__restrict__ bias,
                                 int B, int in_features, int out_features, int imgs) {
    extern __shared__ conv_t xs[];  // [n][in_features]: the tile's rows, contiguous in x too
    const int b0 = blockIdx.x * imgs, n = min(imgs, B - b0);
    const conv_t *xt = x + (long long)b0 * in_features;
    for (int k = threadIdx.x; k < n * in_features; k += blockDim.x) xs[k] = xt[k];
    __syncthreads();
    const int lane = threadIdx.x % 32;
    for (int j = threadIdx.x / 32; j < out_features; j += blockDim.x / 32) {
        const conv_t *wr = w + (long long)j * in_features;
        conv_t acc[DENSE_MAX_IMGS] = {};
        for (int i = lane; i < in_features; i += 32) {
            const conv_t wv = wr[i];
#pragma unroll
            for (int t = 0; t < DENSE_MAX_IMGS; ++t)
                if (t < n) acc[t] += xs[t * in_features + i] * wv;
        }
#pragma unroll
        for (int t = 0; t < DENSE_MAX_IMGS; ++t) {
            if (t >= n) break;  // n is the same for the whole block, so the shuffles stay converged
            for (int off = 16; off > 0; off /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
            if (lane == t) y[(long long)(b0 + t) * out_features + j] = acc[t] + bias[j];
        }
    }
}
