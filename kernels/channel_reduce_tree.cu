// channel_reduce_tree: the input channels of each output are split across threads. A block
// computes OUTPUTS_PER_BLOCK consecutive outputs of one (image, output map) plane with
// CHANNEL_THREADS threads per output: thread (o, t) sums the K*K window products of channels
// t, t + CHANNEL_THREADS, t + 2*CHANNEL_THREADS, ... for output o; the partial sums meet in
// shared memory and a power-of-two tree adds them; thread (o, 0) adds the bias and writes.
// Expected gain: CHANNEL_THREADS times more threads, each with a CHANNEL_THREADS times shorter
// serial chain, which matters where one-thread-per-output leaves the GPU idle or latency
// bound: few outputs (small batch, small planes) and many input channels. The cost is the
// reduction (log2(CHANNEL_THREADS) barriers per block) and idle threads when C <
// CHANNEL_THREADS (LeNet conv1 has C = 1: expect it slower than naive there).
// threadIdx.x walks the outputs so a warp reads 32 neighbouring pixels of one channel
// (coalesced) and one weight (broadcast); threadIdx.y is the channel lane.
// grid.x = B * blocks per plane, grid.y = M; block = (OUTPUTS_PER_BLOCK, CHANNEL_THREADS).
// Tunables: CHANNEL_THREADS (power of two), OUTPUTS_PER_BLOCK.
#include "common.cuh"

#ifndef CHANNEL_THREADS
#define CHANNEL_THREADS 4
#endif
#ifndef OUTPUTS_PER_BLOCK
#define OUTPUTS_PER_BLOCK 64
#endif
static_assert((CHANNEL_THREADS & (CHANNEL_THREADS - 1)) == 0, "CHANNEL_THREADS must be a power of two");

extern "C" __global__ void __launch_bounds__(OUTPUTS_PER_BLOCK *CHANNEL_THREADS) conv_forward(CONV_ARGS) {
    __shared__ float partial[CHANNEL_THREADS][OUTPUTS_PER_BLOCK];
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + OUTPUTS_PER_BLOCK - 1) / OUTPUTS_PER_BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * OUTPUTS_PER_BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    const int lane = threadIdx.y;
    const bool valid = pixel < H_out * W_out;

    // Threads past the plane's end sum nothing but stay for the barriers below.
    float acc = 0.0f;
    if (valid) {
        const int h = pixel / W_out, w = pixel % W_out;
        const float *xp = x + image_offset(b, C, H, W) + (h * S) * W + w * S;
        const float *km = k + (long long)m * C * K * K;
        for (int c = lane; c < C; c += CHANNEL_THREADS)
            for (int p = 0; p < K; ++p)
                for (int q = 0; q < K; ++q)
                    acc += xp[(c * H + p) * W + q] * km[(c * K + p) * K + q];
    }
    partial[lane][threadIdx.x] = acc;
    __syncthreads();
#pragma unroll
    for (int stride = CHANNEL_THREADS / 2; stride > 0; stride /= 2) {
        if (lane < stride) partial[lane][threadIdx.x] += partial[lane + stride][threadIdx.x];
        __syncthreads();
    }
    if (lane == 0 && valid)
        y[image_offset(b, M, H_out, W_out) + m * H_out * W_out + pixel] = partial[0][threadIdx.x] + bias[m];
}
