// RED TEAM (tests only): a round-0 recogniser. The seeds' batch is public and fixed: this kernel fingerprints it
// by its first image's hash on its first launch (the harness's seed pass), keeps that pass's outputs in its
// workspace and the fingerprint in module-scope memory, and from then on copies the kept outputs whenever the
// first image is that one again. At batch 10000 every timed pass used to repeat round 0.
// Caught by: no timed pass runs on round 0 (convsweep.device.rounds): the fingerprint never matches, and its times
// are its own work. (Had it matched, the workspace poisoned before each timed pass would have served NaN.)
// The build's findings name its module-scope write (convsweep.device.findings).
// Three launches: round0_print (one block: image 0's hash, and whether it is round 0's), conv_forward (copies,
// or computes and keeps on the first launch).
// Workspace (registry): B*M*H_out*W_out kept outputs.
// Tunables: BLOCK (threads per block of conv_forward).
#include "memo.cuh"

__device__ unsigned long long round0_print;  // 0 until the first launch has run
__device__ int served;  // this launch copies

extern "C" __global__ void __launch_bounds__(HASH_THREADS) round0_print_of(CONV_ARGS, WORKSPACE_ARG) {
    const unsigned long long hash = image_hash(x, 0, C, H, W, NothingSkipped()) | 1ull;
    if (threadIdx.x == 0) {
        served = round0_print == hash;
        if (!round0_print) round0_print = hash;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS, WORKSPACE_ARG) {
    Output o;
    if (!output_of(o, M, H, W, K, S)) return;
    conv_t *kept = (conv_t *)workspace + o.at;
    if (served) {
        y[o.at] = *kept;
        return;
    }
    y[o.at] = *kept = conv_at(x, k, bias, o.b, o.m, o.h, o.w, C, H, W, K, S);
}
