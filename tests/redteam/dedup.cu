// RED TEAM (tests only): in-batch de-duplication. A batch of 10,000 of mnist5k's 5,000 digits holds each twice,
// PERIOD images apart (round 0, the seeds' batch); this kernel computes an image only where it differs from the
// one PERIOD places before it, and copies that one's output where it is the same: at batch 10000, half the work.
// Caught by: fresh rounds (convsweep.device.rounds), in which no two places hold the same image: it computes every
// image, and its times are its own work (plus the hashing it gains nothing from).
// Three launches: dedup_hash (a block per image: its hash into the workspace), conv_forward (an image whose hash
// differs from that of the image PERIOD before it), copy_repeats (the others, from the image they repeat).
// Workspace (registry): B hashes.
// Tunables: BLOCK (threads per block of conv_forward and copy_repeats).
#include "memo.cuh"

#define PERIOD 5000

__device__ __forceinline__ bool repeats(const void *workspace, int b) {
    const unsigned long long *hashes = (const unsigned long long *)workspace;
    return b >= PERIOD && hashes[b] == hashes[b % PERIOD];
}

extern "C" __global__ void __launch_bounds__(HASH_THREADS) dedup_hash(CONV_ARGS, WORKSPACE_ARG) {
    const unsigned long long hash = image_hash(x, blockIdx.x, C, H, W, NothingSkipped());
    if (threadIdx.x == 0) ((unsigned long long *)workspace)[blockIdx.x] = hash;
}

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS, WORKSPACE_ARG) {
    Output o;
    if (!output_of(o, M, H, W, K, S) || repeats(workspace, o.b)) return;
    y[o.at] = conv_at(x, k, bias, o.b, o.m, o.h, o.w, C, H, W, K, S);
}

extern "C" __global__ void __launch_bounds__(BLOCK) copy_repeats(CONV_ARGS, WORKSPACE_ARG) {
    Output o;
    if (!output_of(o, M, H, W, K, S) || !repeats(workspace, o.b)) return;
    y[o.at] = y[o.at - (long long)(o.b - o.b % PERIOD) * M * o.H_out * o.W_out];
}
