// tiled_shared: each block computes a TILE_H x TILE_W tile of one (image, output map) plane.
// For one input channel at a time the block stages the input patch the tile reads — the tile
// plus its halo, ((TILE_H-1)*S + K) x ((TILE_W-1)*S + K) floats — and the K*K weights of
// (m, c) in shared memory, then every thread reads its window from there.
// Expected gain over naive: naive fetches each input pixel once per window it lies in (up to
// K*K times per output map, through L1/L2); here a block fetches it from global memory once
// per tile (plus the halo overlap between neighbouring tiles), and the weights once per block
// instead of once per thread. The price is two barriers per input channel and the halo
// (at 16x8, K=7, S=1: 22x14 = 308 loads for 128 outputs), and naive's repeated loads mostly
// hit L1 already, so expect a moderate gain, largest for K=7 and S=1 (most reuse per pixel).
// Patch elements past the input's right/bottom edge are stored as zero; they are read only by
// tile positions past the output's edge, which compute but do not write.
// Shared memory is dynamic, sized by the launch; the registry refuses shapes whose patch does
// not fit in 48 KB.
// grid.x = B * tiles per plane (row-major tiles), grid.y = M; block = (TILE_W, TILE_H).
// No __launch_bounds__: with it ptxas squeezes the 64-thread tiles to 32 registers and spills.
// Tunables: TILE_W, TILE_H (output tile; TILE_W * TILE_H threads per block).
#include "common.cuh"

#ifndef TILE_W
#define TILE_W 16
#endif
#ifndef TILE_H
#define TILE_H 8
#endif

extern "C" __global__ void conv_forward(CONV_ARGS) {
    extern __shared__ __align__(8) unsigned char smem_bytes[];
    conv_t *smem = reinterpret_cast<conv_t *>(smem_bytes);
    const int H_out = conv_out_size(H, K, S);
    const int W_out = conv_out_size(W, K, S);
    const int patch_h = (TILE_H - 1) * S + K;
    const int patch_w = (TILE_W - 1) * S + K;
    conv_t *patch = smem;                       // [patch_h][patch_w]
    conv_t *weights = smem + patch_h * patch_w; // [K][K] of (m, c)

    const int tiles_w = (W_out + TILE_W - 1) / TILE_W;
    const int tiles_per_plane = tiles_w * ((H_out + TILE_H - 1) / TILE_H);
    const int b = blockIdx.x / tiles_per_plane;
    const int tile = blockIdx.x % tiles_per_plane;
    const int h0 = (tile / tiles_w) * TILE_H, w0 = (tile % tiles_w) * TILE_W;
    const int m = blockIdx.y;
    const int tid = threadIdx.y * TILE_W + threadIdx.x;
    const int h = h0 + threadIdx.y, w = w0 + threadIdx.x;
    const int row0 = h0 * S, col0 = w0 * S; // input origin of the patch

    const conv_t *xb = x + image_offset(b, C, H, W);
    const conv_t *km = k + (long long)m * C * K * K;
    conv_t acc = 0;
    // No thread leaves before the loop ends: every thread takes part in every load and barrier.
    for (int c = 0; c < C; ++c) {
        const conv_t *xc = xb + c * H * W;
        for (int i = threadIdx.y; i < patch_h; i += TILE_H)
            for (int j = threadIdx.x; j < patch_w; j += TILE_W) {
                const int r = row0 + i, s = col0 + j;
                patch[i * patch_w + j] = (r < H && s < W) ? xc[r * W + s] : conv_t(0);
            }
        for (int i = tid; i < K * K; i += TILE_W * TILE_H)
            weights[i] = km[c * K * K + i];
        __syncthreads();
        const conv_t *window = patch + (threadIdx.y * S) * patch_w + threadIdx.x * S;
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += window[p * patch_w + q] * weights[p * K + q];
        __syncthreads(); // the next channel overwrites the patch
    }
    if (h < H_out && w < W_out)
        y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc + bias[m];
}
