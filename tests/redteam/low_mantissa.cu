// RED TEAM (tests only): how far below its precision class a kernel may cut and still pass. naive.cu's conv in
// float32, but with each weight cut to its MANTISSA_BITS leading mantissa bits (the rest zeroed, as a kernel
// storing its weights in a narrower format would): registered as fp16-class, whose tolerance (1e-2 normwise,
// the accuracy within 0.5 points of the reference's) the gate holds it to.
// Not a cheat the gate must catch at every width: tests/test_redteam.py measures which widths it catches, and
// docs/guarantees.md says what each precision class's tolerance lets through.
// Tunables: BLOCK (threads per block), MANTISSA_BITS (0 to 23: the weight's mantissa bits kept).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef MANTISSA_BITS
#define MANTISSA_BITS 10
#endif

__device__ __forceinline__ float cut(float v) {
    const unsigned int keep = ~((1u << (23 - MANTISSA_BITS)) - 1u);
    return __uint_as_float(__float_as_uint(v) & keep);
}

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
                acc += xb[(c * H + h * S + p) * W + w * S + q] * cut(k[((m * C + c) * K + p) * K + q]);
    y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
}
