// RED TEAM (tests only): write only part of the output. naive.cu's conv, except that every
// SKIP_EVERY-th output element of a launch (the last of each run of SKIP_EVERY) is never written:
// it keeps whatever its buffer held: left alone, what the allocator gave (often zeros, which a
// ReLU and a max-pool mostly hide), or a right answer another kernel wrote there earlier.
// 97 is prime, so the skipped elements walk across maps, rows and images instead of lining up in
// one column, and about 1% of the output is stale: too little for a glance at the accuracy.
// Caught by: the poisoning of every conv output (+huge) before each timed pass and the check of the
// timed pass's logits (convsweep.measure.integrity): a skipped element stays +huge through ReLU and
// max-pool and overflows the logits. Put on conv1, whose output a later layer reads.
// Tunables: BLOCK (threads per block).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif
#define SKIP_EVERY 97

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (pixel >= H_out * W_out) return;
    const int h = pixel / W_out, w = pixel % W_out;
    const long long out = image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w;
    if (out % SKIP_EVERY == SKIP_EVERY - 1) return;  // the cheat: this element is never written

    const conv_t *xb = x + image_offset(b, C, H, W);
    conv_t acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    y[out] = acc;
}
