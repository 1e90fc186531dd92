// RED TEAM (tests only): a memo that waits for the third sighting. Per image slot b, module-scope memory keeps
// the hash of the image last seen there, how many launches in a row saw it, and the output; from the third
// sighting of one image on, the kept output is copied instead of computed. The old caching test timed each
// round twice (N1 N1 N2 N2): the second sighting computed, so it never showed.
// Caught by: the caching test, which times each round three times and holds each later sighting to the first
// (convsweep.measure.integrity): the third sightings are faster in every round, so the run is `suspect`, "sighting 3".
// Its timed passes run on rounds it has not seen: none is served, every one is checked.
// Put on conv2 (its output fits MEMO_OUTPUTS); at most MEMO_IMAGES images a launch.
// Tunables: BLOCK (threads per block of conv_forward).
#include "memo.cuh"

#define MEMO_IMAGES 1024
#define MEMO_OUTPUTS (16 * 34 * 34)

__device__ Slot slots[MEMO_IMAGES];
__device__ conv_t kept[MEMO_IMAGES * MEMO_OUTPUTS];

extern "C" __global__ void __launch_bounds__(HASH_THREADS) memo_lookup(CONV_ARGS) {
    const unsigned long long hash = image_hash(x, blockIdx.x, C, H, W, NothingSkipped());
    if (threadIdx.x == 0) {
        Slot &slot = slots[blockIdx.x];
        const bool again = slot.tag == MEMO_TAG && slot.hash == hash;
        slot.seen = again ? slot.seen + 1 : 1;
        slot.hit = slot.seen >= 3;
        slot.tag = MEMO_TAG;
        slot.hash = hash;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS) {
    Output o;
    if (!output_of(o, M, H, W, K, S)) return;
    conv_t *mine = kept + (long long)o.b * MEMO_OUTPUTS + (o.m * o.H_out + o.h) * o.W_out + o.w;
    if (slots[o.b].hit) {
        y[o.at] = *mine;
        return;
    }
    y[o.at] = *mine = conv_at(x, k, bias, o.b, o.m, o.h, o.w, C, H, W, K, S);
}
