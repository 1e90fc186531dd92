// Shared index helpers for every variant. Tensors are NCHW, contiguous, float32 unless a
// variant's precision says otherwise. Shapes arrive as kernel arguments (B, C, M, H, W, K, S);
// H and W are the input sizes, the output is H_out = (H - K) / S + 1 (valid convolution).
#pragma once

#define CONV_ARGS                                                                          \
    float *__restrict__ y, const float *__restrict__ x, const float *__restrict__ k,        \
        const float *__restrict__ bias, int B, int C, int M, int H, int W, int K, int S

__device__ __forceinline__ int conv_out_size(int in, int k, int s) { return (in - k) / s + 1; }

// Start of image b in a [B][C][H][W] tensor. 64-bit because B*C*H*W passes 2^31 at large
// batches; indices inside one image stay 32-bit, which is cheaper in the inner loops.
__device__ __forceinline__ long long image_offset(int b, int C, int H, int W) {
    return (long long)b * C * H * W;
}
