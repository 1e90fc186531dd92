// naive: one thread per output element, every operand read straight from global memory.
// The seeds' milestone-2 baseline; everything else is measured against it. Expect it to be
// bound by redundant global loads (each input pixel is read K*K*M times, through L1/L2).
// Tunables: BLOCK_X, BLOCK_Y (thread block over output columns, rows). grid.x walks the
// output tiles of every image (tiles * B can exceed the 65535 limit of grid.y/z), grid.y is M.
#include "common.cuh"

#ifndef BLOCK_X
#define BLOCK_X 16
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 16
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y) conv_forward(CONV_ARGS) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int tiles_x = (W_out + BLOCK_X - 1) / BLOCK_X;
    const int tiles = tiles_x * ((H_out + BLOCK_Y - 1) / BLOCK_Y);
    const int b = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const int w = (tile % tiles_x) * BLOCK_X + threadIdx.x;
    const int h = (tile / tiles_x) * BLOCK_Y + threadIdx.y;
    const int m = blockIdx.y;
    if (h >= H_out || w >= W_out) return;

    const float *xb = x + image_offset(b, C, H, W);
    float acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
}
