// The network's other layers on the GPU (not variants: they are the same for every sweep).
// Simple one-thread-per-output kernels; LeNet-86 spends almost all its time in the convs.
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

// y[b][j] = bias[j] + sum_i x[b][i] * w[j][i]: a parallel reduction, one warp per output.
// Lanes stride over i so the weight row and the input row are both read coalesced, then the
// 32 partial sums meet in a shuffle tree.
extern "C" __global__ void dense(conv_t *__restrict__ y, const conv_t *__restrict__ x,
                                 const conv_t *__restrict__ w, const conv_t *__restrict__ bias,
                                 int B, int in_features, int out_features) {
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= (long long)B * out_features) return;
    const int b = warp / out_features, j = warp % out_features;
    const conv_t *xr = x + (long long)b * in_features, *wr = w + (long long)j * in_features;
    conv_t acc = 0;
    for (int i = lane; i < in_features; i += 32) acc += xr[i] * wr[i];
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) y[warp] = acc + bias[j];
}
