// What the memoizing red-team kernels share (tests only): naive.cu's convolution of one output, an order-free
// hash of an image's values (a sum of splitmix64 over (position, bits), which any thread layout can add up, and
// a mask of positions to leave out), and per-image slots of kept outputs. A kernel keeps its slots where the
// harness does not reach them between passes: in module-scope memory (MEMO_IMAGES slots of MEMO_OUTPUTS
// each, fixed at build time), never in its workspace, which the harness poisons before each timed pass.
#pragma once
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif
#define HASH_THREADS 256
#define MEMO_TAG 0x6d656d6f6b657074ULL  // "memokept": a slot that uninitialized memory does not fill by chance

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// The hash of image b of x (C x H x W), its positions for which skip(c, h, w) is true left out: a block's
// threads add their shares, the first thread gets the sum. blockDim.x must be HASH_THREADS.
template <typename Skip>
__device__ unsigned long long image_hash(const conv_t *x, int b, int C, int H, int W, Skip skip) {
    __shared__ unsigned long long partial[HASH_THREADS];
    const unsigned int *image = (const unsigned int *)(x + image_offset(b, C, H, W));
    unsigned long long sum = 0;
    for (int i = threadIdx.x; i < C * H * W; i += HASH_THREADS)
        if (!skip(i / (H * W), (i / W) % H, i % W)) sum += splitmix64(((unsigned long long)i << 32) | image[i]);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = HASH_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    return partial[0];
}

struct NothingSkipped {
    __device__ bool operator()(int, int, int) const { return false; }
};

// naive.cu's output (b, m, h, w).
__device__ __forceinline__ conv_t conv_at(const conv_t *x, const conv_t *k, const conv_t *bias, int b, int m, int h,
                                          int w, int C, int H, int W, int K, int S) {
    const conv_t *xb = x + image_offset(b, C, H, W);
    conv_t acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    return acc;
}

// One thread of conv_forward's grid (naive.cu's: B * blocks per plane, M): which output it is, or false.
struct Output {
    int b, m, h, w, H_out, W_out;
    long long at;  // y's index
};
__device__ __forceinline__ bool output_of(Output &o, int M, int H, int W, int K, int S) {
    o.H_out = conv_out_size(H, K, S);
    o.W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (o.H_out * o.W_out + BLOCK - 1) / BLOCK;
    o.b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    o.m = blockIdx.y;
    if (pixel >= o.H_out * o.W_out) return false;
    o.h = pixel / o.W_out;
    o.w = pixel % o.W_out;
    o.at = image_offset(o.b, M, o.H_out, o.W_out) + (o.m * o.H_out + o.h) * o.W_out + o.w;
    return true;
}

// Per-image slots in module-scope memory: a tag, the last hash seen there, how many times in a row, whether the
// launch in progress serves the kept output, and the output.
struct Slot {
    unsigned long long tag, hash;
    int seen, hit;
};
