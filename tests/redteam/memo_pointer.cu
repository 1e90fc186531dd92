// RED TEAM (tests only): memoize by pointer. The workspace keeps the last input pointer and batch
// size seen and the output computed for them; a launch with the same x and B copies the kept
// output instead of computing. A harness that uploads new images into the same buffer gets the
// old images' answer. Put on conv2, whose input is a lane buffer of the runner at a fixed address.
// Caught by: the workspace poisoned (NaN bytes) before every pass (convsweep.measure.integrity): the kept key
// never matches, it computes every pass, `ok` and no faster than naive. Kept where no poison reaches (module-scope
// memory), the stale output would meet the fresh round in the same buffer and the checked pass: compute_once.cu.
//
// Two launches: memo_check (one thread) decides hit or miss and records this launch's key, so no
// thread of conv_forward reads a key another thread is rewriting; conv_forward copies or computes.
// Workspace (registry): a 32-byte PointerMemo, then B*M*H_out*W_out kept outputs.
// Tunables: BLOCK (threads per block).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif

#define MEMO_TAG 0x6d656d6f70747231ULL  // "memoptr1": a key that uninitialized memory does not hold by chance

struct PointerMemo {
    unsigned long long tag;
    unsigned long long x;
    long long B;
    int hit;
    int pad;
};

extern "C" __global__ void memo_check(CONV_ARGS, WORKSPACE_ARG) {
    PointerMemo *memo = (PointerMemo *)workspace;
    const unsigned long long key = (unsigned long long)x;
    memo->hit = memo->tag == MEMO_TAG && memo->x == key && memo->B == B;
    memo->tag = MEMO_TAG;
    memo->x = key;
    memo->B = B;
}

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS, WORKSPACE_ARG) {
    const PointerMemo *memo = (const PointerMemo *)workspace;
    conv_t *kept = (conv_t *)((char *)workspace + sizeof(PointerMemo));
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (pixel >= H_out * W_out) return;
    const int h = pixel / W_out, w = pixel % W_out;
    const long long out = image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w;
    if (memo->hit) {
        y[out] = kept[out];
        return;
    }
    const conv_t *xb = x + image_offset(b, C, H, W);
    conv_t acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    y[out] = kept[out] = acc;
}
