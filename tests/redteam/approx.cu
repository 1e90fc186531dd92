// RED TEAM (tests only): an approximation just outside the tolerance on a few images. naive.cu's
// conv, except that the outputs of images b % 251 == 7 of each launch (4 of a batch of 1000) are
// scaled by APPROX_SCALE = 1 + 3e-5, as a kernel that cut a corner on some tiles might be off.
// Caught by: the check of every timed pass's logits against float64 (convsweep.measure.integrity,
// convsweep.model.checks: fp32's normwise tolerance 1e-5); the per-layer check samples only the first and
// last image of a chunk, which this kernel leaves exact.
//
// Why 3e-5: on conv2 of LeNet-86 (ReLU and max-pool are positively homogeneous, so the scale
// carries through to the dense layers nearly whole), an error e on those images moves the batch's
// normwise logits error by 0.37e to 1.0e, depending on how large their logits are against the
// batch's largest (measured in numpy over the mnist5k batches and shifted rounds at batch 1000).
// The harness's rounds 0-7 at batch 1000 give 1.56e-5 to 1.94e-5 (1.6-1.9x the tolerance); the
// least of 200 random batches 1.1e-5. A 1% cut would be caught by anything; this one only by a
// check that holds every pass to the tolerance. Honest fp32 accumulation is ~1e-7, far below.
// Tunables: BLOCK (threads per block).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif
#define APPROX_SCALE 1.00003f
#define APPROX_PERIOD 251
#define APPROX_IMAGE 7

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
    if (b % APPROX_PERIOD == APPROX_IMAGE) acc *= APPROX_SCALE;  // the cheat
    y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
}
