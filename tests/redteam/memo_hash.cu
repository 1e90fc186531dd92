// RED TEAM (tests only): memoize by value. For each image slot b the workspace keeps a hash of the
// last input image seen there and the output computed for it; a launch whose image hashes the same
// copies the kept output (fast), any other image is computed and kept (honest). Inputs repeated
// are fast, fresh ones are not, and every output is right: no output check can see it.
// Caught by: the workspace poisoned (NaN bytes) before every pass, the caching test's repeated sightings too
// (convsweep.measure.integrity): no slot's hash is ever found again, it computes every image, and its times are its
// own work: `ok`, no faster than naive. A memo kept in module-scope memory instead is memo_third.cu and memo_layer.cu.
//
// Two launches: memo_lookup (one block per image) hashes the image, sets the slot's hit flag and
// records the new hash; conv_forward copies (hit) or computes and keeps (miss). The hash is a sum
// over the image's elements of splitmix64(position, bits): order-free, so a block can reduce it,
// and 64 bits, so two different images of a run share it with probability ~2^-64.
// Workspace (registry): one record per image slot, a 32-byte ImageMemo and then its M*H_out*W_out
// kept outputs, padded to 32 bytes (slot_of): a slot's place does not depend on the launch's B.
// Tunables: BLOCK (threads per block of conv_forward).
#include "../../kernels/common.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif
#define HASH_THREADS 256
#define MEMO_TAG 0x6d656d6f68736831ULL  // "memohsh1": a slot that uninitialized memory does not fill by chance

struct ImageMemo {
    unsigned long long tag;
    unsigned long long hash;
    int hit;
    int pad[3];
};

__device__ __forceinline__ char *slot_of(void *workspace, int b, int M, int H_out, int W_out) {
    const long long outputs = ((long long)M * H_out * W_out * sizeof(conv_t) + 31) / 32 * 32;
    return (char *)workspace + (long long)b * (sizeof(ImageMemo) + outputs);
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void __launch_bounds__(HASH_THREADS) memo_lookup(CONV_ARGS, WORKSPACE_ARG) {
    __shared__ unsigned long long partial[HASH_THREADS];
    ImageMemo *slot = (ImageMemo *)slot_of(workspace, blockIdx.x, M, conv_out_size(H, K, S), conv_out_size(W, K, S));
    const int n = C * H * W;
    const unsigned int *image = (const unsigned int *)(x + image_offset(blockIdx.x, C, H, W));
    unsigned long long sum = 0;
    for (int i = threadIdx.x; i < n; i += HASH_THREADS)
        sum += splitmix64(((unsigned long long)i << 32) | image[i]);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = HASH_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const unsigned long long hash = partial[0];
        slot->hit = slot->tag == MEMO_TAG && slot->hash == hash;
        slot->tag = MEMO_TAG;
        slot->hash = hash;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) conv_forward(CONV_ARGS, WORKSPACE_ARG) {
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int blocks_per_plane = (H_out * W_out + BLOCK - 1) / BLOCK;
    const int b = blockIdx.x / blocks_per_plane;
    const int pixel = (blockIdx.x % blocks_per_plane) * BLOCK + threadIdx.x;
    const int m = blockIdx.y;
    if (pixel >= H_out * W_out) return;
    const int h = pixel / W_out, w = pixel % W_out;
    const long long out = image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w;
    char *slot = slot_of(workspace, b, M, H_out, W_out);
    conv_t *kept = (conv_t *)(slot + sizeof(ImageMemo)) + (m * H_out + h) * W_out + w;
    if (((const ImageMemo *)slot)->hit) {
        y[out] = *kept;
        return;
    }
    const conv_t *xb = x + image_offset(b, C, H, W);
    conv_t acc = bias[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xb[(c * H + h * S + p) * W + w * S + q] * k[((m * C + c) * K + p) * K + q];
    y[out] = *kept = acc;
}
