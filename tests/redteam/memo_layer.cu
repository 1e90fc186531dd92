// RED TEAM (tests only): a partial memo. Only this layer keeps its outputs (per image slot, in module-scope
// memory, by the image's hash) and serves them from an image's second sighting on; the other layers of the
// network are computed honestly every pass, so a pass of the whole network gains only this layer's time.
// Caught by: the caching test (convsweep.measure.integrity): its layer's events make the second sightings faster in
// every round, so the run is `suspect`, "sighting 2". Its timed passes run on rounds it has not seen.
// Put on conv1 (its output fits MEMO_OUTPUTS); at most MEMO_IMAGES images a launch.
// Tunables: BLOCK (threads per block of conv_forward).
#include "memo.cuh"

#define MEMO_IMAGES 1024
#define MEMO_OUTPUTS (4 * 80 * 80)

__device__ Slot slots[MEMO_IMAGES];
__device__ conv_t kept[MEMO_IMAGES * MEMO_OUTPUTS];

extern "C" __global__ void __launch_bounds__(HASH_THREADS) memo_lookup(CONV_ARGS) {
    const unsigned long long hash = image_hash(x, blockIdx.x, C, H, W, NothingSkipped());
    if (threadIdx.x == 0) {
        Slot &slot = slots[blockIdx.x];
        slot.hit = slot.tag == MEMO_TAG && slot.hash == hash;
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
