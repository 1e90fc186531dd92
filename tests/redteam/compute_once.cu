// RED TEAM (tests only, never registered in kernels/variants.yaml): compute once, then return.
// naive.cu's conv, but only its first launch computes; every later launch returns at once, so
// its output buffer keeps whatever it held (the first pass's answer, unless a harness poisons it).
// Caught by: the poisoning of every conv output before each timed pass and the check of every
// timed pass's logits (convsweep.measure.integrity): the first timed pass fails.
//
// "First launch" is counted in blocks, not launches: a block that finishes adds one to
// blocks_done, and a block returns at its start once blocks_done has reached its own grid's size.
// No block of the first launch can see that (the count reaches the grid size only when its last
// block has begun), and every block of a later launch of the same size does. A pass of one chunk
// is one launch per layer, so the first pass (the harness's seed pass) computes and no other does;
// with several chunks a pass only the first chunk of the first pass would be computed.
// blocks_done lives in the loaded module: one per module instance, i.e. per layer that runs this
// variant (put it on one layer) and per Gpu (a job's later settings never compute at all).
// Tunables: BLOCK (threads per block).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif

__device__ unsigned long long blocks_done = 0;

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS) {
    const unsigned long long grid_blocks = (unsigned long long)gridDim.x * gridDim.y;
    if (*(volatile unsigned long long *)&blocks_done >= grid_blocks) return;  // a later launch: do nothing

    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (pixel < H_out * W_out) {
        const int h = pixel / W_out, w = pixel % W_out;
        const conv_t *xb = x + image_offset(b, C, H, W);
        conv_t acc = bias[m];
        for (int c = 0; c < C; ++c)
            for (int p = 0; p < K; ++p)
                for (int q = 0; q < K; ++q)
                    acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
        y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
    }
    if (threadIdx.x == 0) atomicAdd(&blocks_done, 1ULL);
}
