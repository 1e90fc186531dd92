// restrict_unroll: the naive mapping, but K, C and S are compile-time constants (the layer's
// own values, passed by NVRTC as K_FIXED, C_FIXED, S_FIXED) and the p/q loops are fully
// unrolled with #pragma unroll. With K known, the 7x7 window becomes straight-line code with
// constant offsets: no loop counters, no index multiplies, and the weight loads of one (m, c)
// are hoisted and shared across the window. __restrict__ lets the compiler cache x and k in
// registers and use the read-only path. Expect a modest gain over naive (fewer instructions
// per FMA); it is still bound by redundant input loads.
// The build is per layer shape (the registry's compile_time list). Tunables: BLOCK.
#include "common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef UNROLL_C
#define UNROLL_C 1
#endif

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS) {
    constexpr int KK = K_FIXED, CC = C_FIXED, SS = S_FIXED;
    const int H_out = (H - KK) / SS + 1;
    const int W_out = (W - KK) / SS + 1;
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (pixel >= H_out * W_out) return;
    const int h = pixel / W_out, w = pixel % W_out;

    const conv_t *__restrict__ xp = x + image_offset(b, CC, H, W) + (h * SS) * W + w * SS;
    const conv_t *__restrict__ kp = k + m * CC * KK * KK;
    conv_t acc = bias[m];
#pragma unroll UNROLL_C
    for (int c = 0; c < CC; ++c) {
#pragma unroll
        for (int p = 0; p < KK; ++p)
#pragma unroll
            for (int q = 0; q < KK; ++q)
                acc += xp[(c * H + p) * W + q] * kp[(c * KK + p) * KK + q];
    }
    y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
}
