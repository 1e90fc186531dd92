// fused_conv_relu_pool: conv + bias + ReLU + max-pool in one kernel. Each thread owns one POOLED
// output and computes the P x P conv outputs under its window in registers, so the conv maps
// never reach global memory (LeNet conv2 at B=10000: a 740 MB map that the separate passes
// write, relu reads and rewrites, and maxpool reads again, ~3 GB of traffic, is gone) and, in floor mode, conv outputs that no window
// covers (LeNet conv2: rows/cols 32, 33 of 34) are never computed (-11% FLOPs there).
//
// Mapping: grid.x * BLOCK threads walk the B * H_pool * W_pool pooled pixels row-major (image,
// row, column; no per-plane padding, so an 8x8 plane does not idle a 256-thread block);
// grid.y picks a group of M_PER_THREAD output maps; a thread computes those maps for its pixel.
//
// Why it should be fast (beyond the fusion):
//  * K, C, S are compile-time constants (the build is per layer shape, like restrict_unroll);
//    P is dispatched at run time to instantiations for P = 2, 3, 4 (one uniform branch), so the
//    P x P x K x K window is straight-line FMAs on registers with constant indices.
//  * Input sharing: the P x P conv outputs read one SPAN x SPAN input patch per channel,
//    SPAN = (P-1)*S + K (LeNet conv2: 10x10 for 16 outputs x 49 taps = 784 FMAs), and every
//    patch element is loaded once. Rows slide: weight row p meets input rows p + i*S, so at step
//    p only rows p .. p+(P-1)*S are live and row p+(P-1)*S is loaded just before it is needed:
//    (P-1)*S+1 rows of registers instead of SPAN. Row loads are float4/float2 when W, PS*S and x
//    are aligned for it (a run-time, grid-uniform choice): LeNet conv2 (W=40, PS=4) reads a
//    10-wide row with 3 loads instead of 10; conv1 (W=86, PS=2) uses float2.
//  * The loaded patch serves M_PER_THREAD maps; the block's weights sit in shared memory with
//    rows padded to a multiple of 4, read as broadcast float4s: each weight is loaded once per
//    thread and used P*P times.
//  * Bias and ReLU move past the pool max: bias is constant over the window and relu is
//    monotone, so relu(max(conv) + bias) == max(relu(conv + bias)) exactly for the same sums
//    (rounding is monotone too): 1 add and 1 compare per pooled output instead of P*P each.
//  * NaN propagates like layers.cu: the max keeps a NaN (v > m || v != v), and relu is
//    (v < 0 ? 0 : v), so a poisoned input is not hidden.
// Expected: bound by the FMA issue rate. The sm_90 SASS of one channel step at M_PER_THREAD=2 is
// 1568 FFMA of 1681 instructions for P=4 with float4 rows (LeNet conv2) and 392 of 477 for P=2
// with float2 rows (conv1), so the bound is near the fp32 FMA roof for the FLOPs that remain;
// x is read about once from DRAM (neighbouring windows overlap by SPAN - PS*S columns and meet
// in L1/L2). Cost: the kernel's register count is the largest instantiation's (P=4), so P=2
// layers run at P=4's occupancy (~110-120 registers at M_PER_THREAD=2, ~170-250 at 4).
// Other P (1, 5, ...) take a plain fallback path: correct, not fast.
// Tunables: BLOCK (threads per block), M_PER_THREAD (output maps per thread: more FMAs per
// input load, more accumulator registers; maps past M are computed on zero weights, not stored).
#include "common.cuh"

#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef M_PER_THREAD
#define M_PER_THREAD 2
#endif

static_assert(sizeof(conv_t) == 4, "fused_conv_relu_pool is written for float32 (vector loads)");

namespace {

constexpr int KK = K_FIXED, CC = C_FIXED, SS = S_FIXED, MT = M_PER_THREAD;
constexpr int KP = (KK + 3) / 4 * 4;  // weight row pitch in shared memory: float4 reads

// dst[O .. O+N) = src[0 .. N), with float4 / float2 loads while V (the guaranteed alignment of
// src in elements) allows; the tail falls back to narrower loads.
template <int O, int N, int V, int D>
__device__ __forceinline__ void load_row(conv_t (&dst)[D], const conv_t *__restrict__ src) {
    if constexpr (N >= 4 && V >= 4) {
        const float4 v = __ldg(reinterpret_cast<const float4 *>(src));
        dst[O] = v.x, dst[O + 1] = v.y, dst[O + 2] = v.z, dst[O + 3] = v.w;
        load_row<O + 4, N - 4, V>(dst, src + 4);
    } else if constexpr (N >= 2 && V >= 2) {
        const float2 v = __ldg(reinterpret_cast<const float2 *>(src));
        dst[O] = v.x, dst[O + 1] = v.y;
        load_row<O + 2, N - 2, V>(dst, src + 2);
    } else if constexpr (N >= 1) {
        dst[O] = __ldg(src);
        load_row<O + 1, N - 1, V>(dst, src + 1);
    }
}

__device__ __forceinline__ conv_t max_nan(conv_t m, conv_t v) { return (v > m || v != v) ? v : m; }

// relu(pooled + bias), stored for the maps of this thread's group that exist.
__device__ __forceinline__ void store(conv_t *__restrict__ y, const conv_t *__restrict__ bias, conv_t pooled,
                                      int m, int M, long long plane_base, int pixel, int plane) {
    const conv_t v = pooled + bias[m];
    y[plane_base + (long long)m * plane + pixel] = v < conv_t(0) ? conv_t(0) : v;  // NaN stays NaN
}

// The P x P window at conv origin (h0, w0) for MT maps; xp points at x[b][0][h0*S][w0*S].
template <int P, int V>
__device__ __forceinline__ void window(conv_t *__restrict__ y, const conv_t *__restrict__ xp,
                                       const conv_t *__restrict__ w_s, const conv_t *__restrict__ bias, int m0,
                                       int M, int H, int W, long long plane_base, int pixel, int plane) {
    constexpr int LEAD = (P - 1) * SS;  // rows live besides the newest: the slide
    constexpr int SPAN = LEAD + KK;
    conv_t acc[MT][P][P];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int i = 0; i < P; ++i)
#pragma unroll
            for (int j = 0; j < P; ++j) acc[mi][i][j] = conv_t(0);

#pragma unroll 1
    for (int c = 0; c < CC; ++c) {
        const conv_t *__restrict__ xc = xp + c * H * W;
        const conv_t *__restrict__ wc = w_s + c * KK * KP;
        conv_t rows[SPAN][SPAN];
#pragma unroll
        for (int r = 0; r < LEAD; ++r) load_row<0, SPAN, V>(rows[r], xc + r * W);
#pragma unroll
        for (int p = 0; p < KK; ++p) {
            load_row<0, SPAN, V>(rows[p + LEAD], xc + (p + LEAD) * W);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                conv_t wr[KP];
#pragma unroll
                for (int q4 = 0; q4 < KP; q4 += 4) {
                    const float4 v = *reinterpret_cast<const float4 *>(wc + (mi * CC * KK + p) * KP + q4);
                    wr[q4] = v.x, wr[q4 + 1] = v.y, wr[q4 + 2] = v.z, wr[q4 + 3] = v.w;
                }
#pragma unroll
                for (int q = 0; q < KK; ++q)
#pragma unroll
                    for (int i = 0; i < P; ++i)
#pragma unroll
                        for (int j = 0; j < P; ++j)
                            acc[mi][i][j] = fmaf(rows[i * SS + p][j * SS + q], wr[q], acc[mi][i][j]);
            }
        }
    }

#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
        conv_t m = acc[mi][0][0];
#pragma unroll
        for (int i = 0; i < P; ++i)
#pragma unroll
            for (int j = 0; j < P; ++j) m = max_nan(m, acc[mi][i][j]);
        if (m0 + mi < M) store(y, bias, m, m0 + mi, M, plane_base, pixel, plane);
    }
}

// Any other window size: one conv output at a time, same weights, same epilogue.
__device__ __forceinline__ void window_any(conv_t *__restrict__ y, const conv_t *__restrict__ xp,
                                        const conv_t *__restrict__ w_s, const conv_t *__restrict__ bias, int m0,
                                        int M, int H, int W, int P, long long plane_base, int pixel, int plane) {
    for (int mi = 0; mi < MT && m0 + mi < M; ++mi) {
        conv_t m = conv_t(0);
        for (int i = 0; i < P; ++i)
            for (int j = 0; j < P; ++j) {
                conv_t acc = conv_t(0);
                for (int c = 0; c < CC; ++c) {
                    const conv_t *__restrict__ xw = xp + (c * H + i * SS) * W + j * SS;
                    const conv_t *__restrict__ wc = w_s + (mi * CC + c) * KK * KP;
#pragma unroll
                    for (int p = 0; p < KK; ++p)
#pragma unroll
                        for (int q = 0; q < KK; ++q) acc = fmaf(xw[p * W + q], wc[p * KP + q], acc);
                }
                m = (i == 0 && j == 0) ? acc : max_nan(m, acc);
            }
        store(y, bias, m, m0 + mi, M, plane_base, pixel, plane);
    }
}

template <int P>
__device__ __forceinline__ void dispatch_vec(int vec, conv_t *__restrict__ y, const conv_t *__restrict__ xp,
                                             const conv_t *__restrict__ w_s, const conv_t *__restrict__ bias,
                                             int m0, int M, int H, int W, long long plane_base, int pixel, int plane) {
    if (vec == 4)
        window<P, 4>(y, xp, w_s, bias, m0, M, H, W, plane_base, pixel, plane);
    else if (vec == 2)
        window<P, 2>(y, xp, w_s, bias, m0, M, H, W, plane_base, pixel, plane);
    else
        window<P, 1>(y, xp, w_s, bias, m0, M, H, W, plane_base, pixel, plane);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK) conv_relu_pool(CONV_ARGS, POOL_ARGS) {
    // Weights of this block's maps, [MT][C][K][KP], zero-padded (rows past K, maps past M).
    __shared__ __align__(16) conv_t w_s[MT * CC * KK * KP];
    const int m0 = blockIdx.y * MT;
    for (int e = threadIdx.x; e < MT * CC * KK * KP; e += BLOCK) {
        const int q = e % KP, row = e / KP;  // row = (mi * C + c) * K + p
        const int mi = row / (CC * KK), cp = row % (CC * KK);
        w_s[e] = (q < KK && m0 + mi < M) ? k[((long long)(m0 + mi) * CC * KK + cp) * KK + q] : conv_t(0);
    }
    __syncthreads();

    const int H_out = (H - KK) / SS + 1, W_out = (W - KK) / SS + 1;
    const int H_pool = (H_out - P) / PS + 1, W_pool = (W_out - P) / PS + 1;
    const int plane = H_pool * W_pool;
    const int idx = blockIdx.x * BLOCK + threadIdx.x;  // < B * plane + BLOCK (registry constraint)
    if (idx >= B * plane) return;
    const int b = idx / plane, pixel = idx % plane;
    const int ph = pixel / W_pool, pw = pixel % W_pool;

    const conv_t *__restrict__ xp = x + image_offset(b, CC, H, W) + (ph * PS * SS) * W + pw * PS * SS;
    const long long plane_base = image_offset(b, M, H_pool, W_pool);
    // Widest row load every thread's rows are aligned for: row starts step by W and windows by
    // PS*S elements, images by C*H*W (a multiple of W); x itself must be aligned too.
    const int step = W | (PS * SS);
    const unsigned long long base = reinterpret_cast<unsigned long long>(x);
    const int vec = (step % 4 == 0 && base % 16 == 0) ? 4 : (step % 2 == 0 && base % 8 == 0) ? 2 : 1;
    switch (P) {
        case 2: dispatch_vec<2>(vec, y, xp, w_s, bias, m0, M, H, W, plane_base, pixel, plane); break;
        case 3: dispatch_vec<3>(vec, y, xp, w_s, bias, m0, M, H, W, plane_base, pixel, plane); break;
        case 4: dispatch_vec<4>(vec, y, xp, w_s, bias, m0, M, H, W, plane_base, pixel, plane); break;
        default: window_any(y, xp, w_s, bias, m0, M, H, W, P, plane_base, pixel, plane);
    }
}
