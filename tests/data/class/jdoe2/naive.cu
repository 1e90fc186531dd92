// naive: one thread per output element, every operand read straight from global memory.
// The seeds' milestone-2 baseline; everything else is measured against it. Expect it to be
// bound by redundant loads: each input pixel is fetched K*K*M times (through L1/L2).
// Threads walk the H_out*W_out outputs of one (image, map) plane in row-major order, so a
// 34x34 plane wastes 10% of its last block instead of the ~40% a 16x16 tiling idles.
// grid.x = B * blocks per plane (2^31 - 1 limit; grid.y/z stop at 65535), grid.y = M.
// Tunables: BLOCK (threads per block).
#include "common.cuh"

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
