// channel_reduce_atomic: the channel split of channel_reduce_tree, but each thread adds its
// partial sum straight into y with atomicAdd instead of meeting the others in a shared-memory
// tree. That removes the shared memory and every barrier (threads finish independently), at
// the price of CHANNEL_THREADS atomic read-modify-writes per output at L2 and a second launch:
// conv_init_bias first writes bias[m] into every output, then conv_forward accumulates.
// Expected: about the same as the tree where C >= CHANNEL_THREADS (the atomics of one output
// come from different warps, so they do not serialise inside a warp); it shows what the
// barriers of the tree cost against the atomics' L2 traffic. The summation order across
// threads is not fixed, so results vary in the last bits from run to run.
// threadIdx.x walks the outputs (coalesced input reads, broadcast weights), threadIdx.y is the
// channel lane. Both kernels: grid.x = B * blocks per plane, grid.y = M;
// block = (OUTPUTS_PER_BLOCK, CHANNEL_THREADS), so both cover the same outputs.
// Tunables: CHANNEL_THREADS, OUTPUTS_PER_BLOCK.
#include "common.cuh"

#ifndef CHANNEL_THREADS
#define CHANNEL_THREADS 4
#endif
#ifndef OUTPUTS_PER_BLOCK
#define OUTPUTS_PER_BLOCK 64
#endif

// Every output of the plane is covered: the (OUTPUTS_PER_BLOCK x CHANNEL_THREADS) threads of a
// block walk its OUTPUTS_PER_BLOCK outputs, each written by exactly one thread.
extern "C" __global__ void __launch_bounds__(OUTPUTS_PER_BLOCK *CHANNEL_THREADS) conv_init_bias(CONV_ARGS) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + OUTPUTS_PER_BLOCK - 1) / OUTPUTS_PER_BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int m = blockIdx.y;
    const int first = (blockIdx.x % blocks_per_plane) * OUTPUTS_PER_BLOCK;
    const int count = min(OUTPUTS_PER_BLOCK, H_out * W_out - first);
    float *yp = y + image_offset(b, M, H_out, W_out) + m * H_out * W_out + first;
    const float value = bias[m];
    for (int i = threadIdx.y * OUTPUTS_PER_BLOCK + threadIdx.x; i < count; i += OUTPUTS_PER_BLOCK * CHANNEL_THREADS)
        yp[i] = value;
}

extern "C" __global__ void __launch_bounds__(OUTPUTS_PER_BLOCK *CHANNEL_THREADS) conv_forward(CONV_ARGS) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + OUTPUTS_PER_BLOCK - 1) / OUTPUTS_PER_BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * OUTPUTS_PER_BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    const int lane = threadIdx.y;
    // No barriers here, so threads with nothing to add may leave at once.
    if (pixel >= H_out * W_out || lane >= C) return;

    const int h = pixel / W_out, w = pixel % W_out;
    const float *xp = x + image_offset(b, C, H, W) + (h * S) * W + w * S;
    const float *km = k + (long long)m * C * K * K;
    float acc = 0.0f;
    for (int c = lane; c < C; c += CHANNEL_THREADS)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xp[(c * H + p) * W + q] * km[(c * K + p) * K + q];
    atomicAdd(y + image_offset(b, M, H_out, W_out) + m * H_out * W_out + pixel, acc);
}
