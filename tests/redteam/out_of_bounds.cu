// RED TEAM (tests only): not a cheat but a bug the output check cannot see: naive.cu's conv, and the last thread
// of each launch also writes one element past the end of y (a tile's edge gone wrong). Every output is right.
// Caught by: `sanitize: true` (convsweep.sweep.sanitize): compute-sanitizer's memcheck sees the write out of bounds,
// and the setting is `incorrect` with its line.
// Tunables: BLOCK (threads per block).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (b == B - 1 && m == M - 1 && pixel == H_out * W_out - 1)
        y[(long long)B * M * H_out * W_out + 64] = conv_t(0);  // past the end of y
    if (pixel >= H_out * W_out) return;
    const int h = pixel / W_out, w = pixel % W_out;
    const conv_t *xb = x + image_offset(b, C, H, W);
    conv_t acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
}
