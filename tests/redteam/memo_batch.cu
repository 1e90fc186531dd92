// RED TEAM (tests only): a memo of the whole batch in the workspace, which a kernel owns between passes (the
// registry gives each stream one). The first launch keeps the batch's hash and its output there; a launch whose
// batch hashes the same copies the output. With `checks: fast`, every timed pass used to repeat round 0: the
// memo served them all, and the sweeps that ship fast checks (the tuning sweeps) ranked it first.
// Caught by: fresh rounds in every mode (no batch repeats) and the workspace poisoned before each timed pass
// (convsweep.measure.integrity): nothing is served, its times are its own work.
// Three launches: memo_hash (a block per image, each adds its image's hash into the workspace's partial sums),
// memo_decide (one thread: hit or miss, and the new key), conv_forward (copies, or computes and keeps).
// Workspace (registry): a 32-byte BatchMemo, B partial hashes, then B*M*H_out*W_out kept outputs.
// Tunables: BLOCK (threads per block of conv_forward).
#include "memo.cuh"

struct BatchMemo {
    unsigned long long tag, hash;
    long long B;
    int hit, pad;
};

extern "C" __global__ void __launch_bounds__(HASH_THREADS) memo_hash(CONV_ARGS, WORKSPACE_ARG) {
    const unsigned long long hash = image_hash(x, blockIdx.x, C, H, W, NothingSkipped());
    if (threadIdx.x == 0) ((unsigned long long *)((BatchMemo *)workspace + 1))[blockIdx.x] = splitmix64(hash + blockIdx.x);
}

extern "C" __global__ void memo_decide(CONV_ARGS, WORKSPACE_ARG) {
    BatchMemo *memo = (BatchMemo *)workspace;
    const unsigned long long *partial = (const unsigned long long *)(memo + 1);
    unsigned long long hash = 0;
    for (int b = 0; b < B; ++b) hash += partial[b];
    memo->hit = memo->tag == MEMO_TAG && memo->hash == hash && memo->B == B;
    memo->tag = MEMO_TAG;
    memo->hash = hash;
    memo->B = B;
}

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS, WORKSPACE_ARG) {
    Output o;
    if (!output_of(o, M, H, W, K, S)) return;
    const BatchMemo *memo = (const BatchMemo *)workspace;
    conv_t *kept = (conv_t *)((char *)workspace + sizeof(BatchMemo) + 8 * (long long)B) + o.at;
    if (memo->hit) {
        y[o.at] = *kept;
        return;
    }
    y[o.at] = *kept = conv_at(x, k, bias, o.b, o.m, o.h, o.w, C, H, W, K, S);
}
