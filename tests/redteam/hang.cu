// RED TEAM (tests only): not a cheat but a bug: a kernel that never ends (one thread spins on a flag nothing
// sets). Every other thread is naive.cu's conv.
// Caught by: the job's deadline (convsweep.measure.deadline): the pass runs past `deadline_s`, the worker and its
// CUDA context are killed, the setting is stored as `timeout`, and the GPU and its lock are free for the next job.
// Tunables: BLOCK (threads per block).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        volatile int waiting = 1;  // volatile: every read is kept, so the loop is neither removed nor assumed to end
        while (waiting)
            __nanosleep(1000);
    }
    if (pixel >= H_out * W_out) return;
    const int h = pixel / W_out, w = pixel % W_out;
    const conv_t *xb = x + image_offset(b, C, H, W);
    conv_t acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;
}
