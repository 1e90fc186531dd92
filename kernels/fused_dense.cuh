// fused_dense.cuh: the dense tail of the fused networks (fp16_fused_network.cu, wgmma_fused_network.cu),
// fc1 -> ReLU -> fc2 for a group of images whose flattened fp16 features are in shared memory: fc1 as
// mma.sync m16n8k16 with the group's images as n (fc1's weights read once per group), a k-slice of the
// features per warp, the slices summed in shared memory; then bias, ReLU and fc2 in fp32.
// The shape is the includer's: kWarps warps (the block), kGroup images a group, kFeat features an image (rows
// kFeatStride halves apart), kN1 fc1 outputs, kN2 fc2 outputs (the logits).
#pragma once

#include "mma_f16.cuh"

// Two consecutive halves in shared memory as one 32-bit register (an f16x2 fragment).
__device__ __forceinline__ unsigned lds32(const unsigned short *p) { return *reinterpret_cast<const unsigned *>(p); }

// The rest of the dense phase, after fc1's mma: each warp's partial sums (acc, its k-slice; acc[mt] as
// mma.m16n8k16's D) through shared memory to warp `img` (one warp per image of the group), whose lane o
// sums fc1 output o over the k-slices, adds the bias and applies ReLU; fc2 then stays in the warp: each
// logit a product per lane and a butterfly of shuffles, so no thread walks a 32-step chain and the hidden
// layer needs no barrier of its own. The logits of the group's first n images are written.
template <int kWarps, int kGroup, int kN1, int kN2, class YRow>
__device__ __forceinline__ void dense_tail(const float (&acc)[2][4], float *part, const float *__restrict__ b1,
                                           const float *__restrict__ w2, const float *__restrict__ b2,
                                           float *__restrict__ y, YRow y_row, int n, int warp, int lane) {
    static_assert(kN1 == 32 && kWarps == kGroup, "a lane per fc1 output, a warp per image");
    constexpr int PITCH = kN1 + 4;  // part[warp][image][output], rows 4 words apart: the stores below hit
                                    // 32 distinct banks (lanes g: + 1 word, t: + 8), the loads 32 as well
    const int g = lane >> 2, t = lane & 3;
    // d0, d1 are (output mt*16 + g, images 2t, 2t+1), d2, d3 output + 8.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        float *p = part + (warp * kGroup + 2 * t) * PITCH + mt * 16 + g;
        p[0] = acc[mt][0], p[PITCH] = acc[mt][1], p[8] = acc[mt][2], p[PITCH + 8] = acc[mt][3];
    }
    __syncthreads();
    const int img = warp, o = lane;
    float h = __ldg(b1 + o);
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) h += part[(wi * kGroup + img) * PITCH + o];
    h = h < 0.f ? 0.f : h;  // ReLU (NaN stays NaN)
    float logit = 0.f;
#pragma unroll
    for (int m = 0; m < kN2; ++m) {
        float v = h * __ldg(w2 + m * kN1 + o);
#pragma unroll
        for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
        if (o == m) logit = v;
    }
    if (img < n && o < kN2) y[y_row(img) * kN2 + o] = logit + __ldg(b2 + o);
}

// fc1 (mma, n = the group's images) + bias + ReLU, then fc2 in fp32, for the `n` images of a group: the
// group's image i is row y_row(i) of y (the logits, [image][kN2]), its features row i of `feat`. `part` is
// shared scratch of 4 * (kN1 + 4) * kGroup * kWarps bytes.
template <int kWarps, int kGroup, int kFeat, int kFeatStride, int kN1, int kN2, class YRow>
__device__ __forceinline__ void dense(const unsigned short *feat, float *part, const float *__restrict__ w1,
                                      const float *__restrict__ b1, const float *__restrict__ w2,
                                      const float *__restrict__ b2, float *__restrict__ y, YRow y_row, int n, int warp,
                                      int lane) {
    constexpr int K_SLICE = kFeat / kWarps;  // fc1 inputs per warp
    static_assert(kN1 == 32 && kGroup == 8 && kN2 <= kN1, "fc1's two m16 tiles, the group as the mma's n8");
    static_assert(K_SLICE * kWarps == kFeat && K_SLICE % 16 == 0, "whole k16 steps per warp");
    static_assert(32 * kWarps == kN1 * kGroup, "dense_tail: a warp per image, a lane per fc1 output");
    const int g = lane >> 2, t = lane & 3;
    float acc[2][4] = {};
#pragma unroll 2
    for (int k = warp * K_SLICE; k < (warp + 1) * K_SLICE; k += 16) {
        const unsigned short *f = feat + g * kFeatStride + k + 2 * t;  // B: image g, inputs k + 2t (+8)
        const unsigned bl = lds32(f), bh = lds32(f + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            const float *wp = w1 + (mt * 16 + g) * kFeat + k + 2 * t;  // A: outputs mt*16 + g (+8)
            const float2 w00 = __ldg(reinterpret_cast<const float2 *>(wp)), w10 = __ldg(reinterpret_cast<const float2 *>(wp + 8 * kFeat));
            const float2 w01 = __ldg(reinterpret_cast<const float2 *>(wp + 8)), w11 = __ldg(reinterpret_cast<const float2 *>(wp + 8 * kFeat + 8));
            mma_f16_k16(acc[mt], pack_half2(w00.x, w00.y), pack_half2(w10.x, w10.y), pack_half2(w01.x, w01.y),
                        pack_half2(w11.x, w11.y), bl, bh);
        }
    }
    dense_tail<kWarps, kGroup, kN1, kN2>(acc, part, b1, w2, b2, y, y_row, n, warp, lane);
}

// fc1's weights as mma.m16n8k16 A fragments in fp16, in the order dense_fragments reads them: entry
// (s * 2 + mt) * 32 + lane holds lane (g, t)'s four f16x2 registers of k-step s (inputs 16 s ..) and m-tile
// mt (outputs 16 mt ..): (output 16 mt + g, inputs 16 s + 2t, + 1), (output + 8), (inputs + 8), (both).
template <int kFeat>
__device__ __forceinline__ uint4 fc1_fragment(const float *__restrict__ w1, int e) {
    const int lane = e % 32, mt = e / 32 % 2, s = e / 64, g = lane >> 2, t = lane & 3;
    const float *wp = w1 + (16 * mt + g) * kFeat + 16 * s + 2 * t;
    return make_uint4(pack_half2(wp[0], wp[1]), pack_half2(wp[8 * kFeat], wp[8 * kFeat + 1]),
                      pack_half2(wp[8], wp[9]), pack_half2(wp[8 * kFeat + 8], wp[8 * kFeat + 9]));
}

// dense() with fc1's weights as fragments (fc1_fragment, in global memory): a warp's whole k-slice of them,
// 16 bytes per lane and (k-step, m-tile), is loaded before its first mma, so a group waits on L2 once, not
// once per k-step, and reads half the bytes (fp16) with no conversion.
template <int kWarps, int kGroup, int kFeat, int kFeatStride, int kN1, int kN2, class YRow>
__device__ __forceinline__ void dense_fragments(const unsigned short *feat, float *part, const uint4 *__restrict__ w1f,
                                                const float *__restrict__ b1, const float *__restrict__ w2,
                                                const float *__restrict__ b2, float *__restrict__ y, YRow y_row, int n,
                                                int warp, int lane) {
    constexpr int K_SLICE = kFeat / kWarps, STEPS = K_SLICE / 16;  // fc1 inputs per warp, its k16 steps
    static_assert(kN1 == 32 && kGroup == 8 && kN2 <= kN1, "fc1's two m16 tiles, the group as the mma's n8");
    static_assert(K_SLICE * kWarps == kFeat && K_SLICE % 16 == 0, "whole k16 steps per warp");
    static_assert(32 * kWarps == kN1 * kGroup, "dense_tail: a warp per image, a lane per fc1 output");
    const int g = lane >> 2, t = lane & 3;
    uint4 wf[STEPS][2];
#pragma unroll
    for (int s = 0; s < STEPS; ++s)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) wf[s][mt] = __ldg(w1f + ((warp * STEPS + s) * 2 + mt) * 32 + lane);
    float acc[2][4] = {};
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
        const unsigned short *f = feat + g * kFeatStride + (warp * STEPS + s) * 16 + 2 * t;  // B: image g
        const unsigned bl = lds32(f), bh = lds32(f + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_f16_k16(acc[mt], wf[s][mt].x, wf[s][mt].y, wf[s][mt].z, wf[s][mt].w, bl, bh);
    }
    dense_tail<kWarps, kGroup, kN1, kN2>(acc, part, b1, w2, b2, y, y_row, n, warp, lane);
}
