// fp16_fused_network: the whole LeNet-86 forward in one kernel, conv1 -> ReLU -> pool -> conv2 ->
// ReLU -> pool -> flatten -> fc1 -> ReLU -> fc2, every intermediate map kept in shared memory: the
// only global traffic is each image (29.6 KB), the weights (L2-resident) and 10 logits per image.
// Separately, the layers write the 256 MB of pooled conv1 maps at batch 10000 and read them back.
//
// The grid is one wave (BLOCKS blocks; a batch smaller than that gets a block per image); a block takes
// an equal share of consecutive images, one at a time, with all its warps on each phase:
//   load     the image's fp32 rows arrive by cp.async while the previous image computes;
//   stage    rows -> fp16 (plus a copy shifted by one element, so every fragment is a 32-bit word);
//   conv1    the sliding-window mma of sliding_window.cuh (RPAIR: k 0-7 one input row, k 8-15 the
//            next; n = two conv rows x 4 maps), a warp per pooled row; the epilogue pools, adds the
//            bias, applies ReLU and writes fp16 straight into conv2's staged rows (both copies);
//   conv2    the same mma with channel pairs (CPAIR), a warp per pooled row and both n8 map blocks;
//            the epilogue writes the image's flattened fp16 features [16][8][8];
//   dense    after every GROUP (8) images: fc1 as mma with the 8 images as n (the weights read once
//            per 8 images), a k-slice per warp summed in shared memory, then bias, ReLU and fc2 in fp32.
// Fragments, pixel orders and the pools' lanes are those of sliding_window.cuh; mma_f16.cuh has the
// instructions.
//
// Floors (H100, B=10000): reading the images is 0.099 ms; the mma work (800 m16n8k16 for conv1 and
// 1792 for conv2 per image, 106 GFLOP issued) is 0.16 ms at the 693 TFLOP/s the bench measured for
// cuBLAS fp16 and about twice that at mma.sync's usual share of it; separately the two conv layers
// take 0.257 + 0.308 ms. docs/performance.md has the measurements.
// Tunables (registry): BLOCKS (the grid: 2 per SM fills an H100 in one wave, no tail of half-empty
// SMs; each block's setup, the B fragments, is spread over B / BLOCKS images).
//
// Absorbing the input's upsample (registry absorbs_input; SRC_H_FIXED > 0, input u8-source): x holds
// each image's stored bytes [SRC_H][SRC_W] (784 for a 28x28 digit) rather than the fp32 input, and the
// kernel takes upsample_u8's ratio_h, ratio_w and divisor after its other arguments. Why: upsample_u8
// writes the 296 MB of fp32 input at batch 10000 for this kernel to read back, ~0.27 ms end to end
// beside a 0.385 ms forward; absorbed, an image is 784 bytes of reads. The block works out every input
// row's and column's taps once, as layers.cu's bilinear_source; per image, the bytes arrive by cp.async,
// `blend_columns` blends each source row's columns and `stage_source` the rows, in upsample_u8's
// float operations and order (the columns first), then rounds to half as stage_input does: the logits
// are bit for bit those of upsample_u8 followed by this kernel on its output.
#include "common.cuh"
#include "mma_f16.cuh"
#include "fused_dense.cuh"

namespace {

// The network's shape, compiled in (registry compile_time) and held to what this kernel is written for.
static_assert(C_FIXED == 1 && M_FIXED == 4 && K_FIXED == 7 && S_FIXED == 1 && P_FIXED == 2 && PS_FIXED == 2,
              "conv1: 1 -> 4 maps, 7x7, stride 1, 2x2 pool (see the registry constraints)");
static_assert(M2_FIXED == 16 && K2_FIXED == 7 && S2_FIXED == 1 && P2_FIXED == 4 && PS2_FIXED == 4,
              "conv2: 4 -> 16 maps, 7x7, stride 1, 4x4 pool");
static_assert(N1_FIXED == 32 && N2_FIXED <= 32, "fc1: 32 outputs; fc2: at most 32");

constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int GROUP = 8;                                   // images per dense mma (its n)
constexpr int kH = H_FIXED, kW = W_FIXED, kK = K_FIXED;    // input rows and columns, conv1's kernel
constexpr int M1 = M_FIXED, M2 = M2_FIXED, K2 = K2_FIXED, N1 = N1_FIXED, N2 = N2_FIXED;
constexpr int HP1 = (kH - kK + 1) / 2, WP1 = (kW - kK + 1) / 2;          // pooled conv1 maps
constexpr int HP2 = (HP1 - K2 + 1 - 4) / 4 + 1, WP2 = (WP1 - K2 + 1 - 4) / 4 + 1;  // pooled conv2 maps
constexpr int FEAT = M2 * HP2 * WP2;                       // fc1's inputs
constexpr int TILES1 = (2 * WP1 + 15) / 16, TILES2 = (4 * WP2 + 15) / 16;  // 16-pixel tiles of used columns
constexpr int PW1 = 16 * TILES1 + 8;                       // staged input row (halves): past the last fragment
constexpr int PW2 = (16 * TILES2 + 8 > WP1 ? 16 * TILES2 + 8 : WP1 + 1) / 2 * 2;  // staged pooled conv1 row
constexpr int D1 = kK + 1;                                 // input rows one conv1 row pair reads
constexpr int F1 = D1 / 2, F2 = M1 / 2 * K2 * (M2 / 8);    // B fragments: conv1 (row pairs), conv2
constexpr int FEAT_STRIDE = FEAT + 8;                      // halves: images' feature rows 4 banks apart
constexpr int CH2 = HP1 * 2 * PW2 + 16;                    // halves per staged conv2 channel: 8 banks apart, so
                                                           // conv1's epilogue stores its 4 maps conflict-free
constexpr int ROWS1 = HP1 / WARPS;                         // pooled conv1 rows per warp
static_assert(kK % 2 == 1 && HP2 <= WARPS && HP1 % WARPS == 0 && M2 % 8 == 0 && M1 % 2 == 0,
              "the mappings below");
static_assert(4 * HP2 + K2 - 2 < HP1 && 2 * HP1 + D1 - 3 < kH, "row reads stay inside the maps");

// Shared memory, in bytes (the registry's shared_bytes says the same; the kernel checks it).
#if SRC_H_FIXED > 0
constexpr int kSH = SRC_H_FIXED, kSW = SRC_W_FIXED;      // the stored image's rows and columns
static_assert(kSH * kSW % 16 == 0, "each image starts 16-byte aligned and is whole 16-byte chunks (cp.async)");
static_assert(kW % 2 == 0, "blended rows of whole float2 pairs");

// One input row's (or column's) two source rows (columns) and their weights, as bilinear_source gives them.
struct Tap {
    int lo, hi;
    float w_lo, w_hi;
};

constexpr int RAW_BYTES = kSH * kSW;                      // the next image's stored bytes, as they arrive
constexpr int QUOTIENT_BYTES = 4 * 256;                   // byte / divisor for every byte
constexpr int TAP_BYTES = 16 * (kH + kW);                 // the taps of every input row, then every column
constexpr int BLEND_BYTES = 16 * ((kSH * kW + 3) / 4);    // each source row blended to kW columns, fp32
constexpr int INPUT_BYTES = RAW_BYTES + QUOTIENT_BYTES + TAP_BYTES + BLEND_BYTES;
static_assert(sizeof(Tap) == 16, "TAP_BYTES");
#else
static_assert((kH * kW) % 4 == 0, "each image starts 16-byte aligned and is whole 16-byte chunks (cp.async)");
constexpr int RAW_BYTES = 4 * kH * kW;                    // the next image, fp32, as it arrives
constexpr int INPUT_BYTES = RAW_BYTES;
#endif
constexpr int X1_BYTES = 2 * kH * 2 * PW1;                // input rows, fp16, plain and shifted
constexpr int X2_BYTES = 2 * M1 * CH2;                    // pooled conv1 maps, the same way
constexpr int B1_BYTES = 8 * 32 * F1, B2_BYTES = 8 * 32 * F2;
constexpr int FEAT_BYTES = 2 * GROUP * FEAT_STRIDE;
constexpr int SHARED_BYTES = INPUT_BYTES + X1_BYTES + X2_BYTES + B1_BYTES + B2_BYTES + FEAT_BYTES;
static_assert(4 * WARPS * GROUP * (N1 + 4) <= X1_BYTES, "fc partial sums (fused_dense.cuh: dense_tail) fit where x1 is idle");
static_assert(INPUT_BYTES % 16 == 0 && X1_BYTES % 16 == 0 && X2_BYTES % 16 == 0, "alignment of what follows");

// Every thread's share of one image's 16-byte chunks into `raw`, as one cp.async group.
__device__ __forceinline__ void load_image(float *raw, const float *__restrict__ src) {
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(raw));
    for (int c = threadIdx.x; c < kH * kW / 4; c += THREADS)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 16 * c), "l"(src + 4 * c) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ void wait_image() { asm volatile("cp.async.wait_all;" ::: "memory"); }

#if SRC_H_FIXED > 0
// Every thread's share of one image's stored bytes into `raw`, as one cp.async group.
__device__ __forceinline__ void load_image(unsigned char *raw, const unsigned char *__restrict__ src) {
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(raw));
    for (int c = threadIdx.x; c < kSH * kSW / 16; c += THREADS)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 16 * c), "l"(src + 16 * c) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// layers.cu's bilinear_source, verbatim (tests/test_absorbed_input.py holds them equal): output i's
// two sources and weights, the position worked out in double with each step rounded.
__device__ __forceinline__ void bilinear_source(int i, int n_in, double ratio, int &lo, int &hi, conv_t &w_lo,
                                                conv_t &w_hi) {
    double src = __dsub_rn(__dmul_rn(i + 0.5, ratio), 0.5);
    src = src > 0.0 ? src : 0.0;
    lo = min((int)src, n_in - 1);  // src >= 0: truncation is floor
    hi = min(lo + 1, n_in - 1);
    const double frac = src - lo;
    w_lo = (conv_t)(1.0 - frac);
    w_hi = (conv_t)frac;
}

// Once per block: upsample_u8's quotient table, and the taps of every input row (taps[0, kH)) and
// column (taps[kH, kH + kW)).
__device__ __forceinline__ void source_setup(float *quotient, Tap *taps, double ratio_h, double ratio_w,
                                             float divisor) {
    for (int v = threadIdx.x; v < 256; v += THREADS) quotient[v] = conv_t(v) / conv_t(divisor);
    for (int i = threadIdx.x; i < kH + kW; i += THREADS) {
        Tap t;
        if (i < kH)
            bilinear_source(i, kSH, ratio_h, t.lo, t.hi, t.w_lo, t.w_hi);
        else
            bilinear_source(i - kH, kSW, ratio_w, t.lo, t.hi, t.w_lo, t.w_hi);
        taps[i] = t;
    }
}

// raw (bytes [kSH][kSW]) -> blended (fp32 [kSH][kW]): each source row's columns blended, which is
// upsample_u8's `top` (or `bottom`) of every output in that column whose row reads this source row.
__device__ __forceinline__ void blend_columns(const unsigned char *raw, const float *quotient, const Tap *cols,
                                              float *blended) {
    for (int e = threadIdx.x; e < kSH * kW; e += THREADS) {
        const int r = e / kW, j = e % kW;
        const Tap c = cols[j];
        const unsigned char *p = raw + r * kSW;
        blended[e] = quotient[p[c.lo]] * c.w_lo + quotient[p[c.hi]] * c.w_hi;  // upsample_u8's expression
    }
}

// Input value = upsample_u8's blend of the rows and its clamp to [0, 1].
__device__ __forceinline__ float input_value(const Tap &r, float top, float bottom) {
    const float v = r.w_lo * top + r.w_hi * bottom;
    return v < 0.f ? 0.f : (v > 1.f ? 1.f : v);
}

// blended -> x1 as stage_input lays it out (the same warps, lanes, pairs and shifted copy): a warp per
// input row, whose taps every lane shares; each value rounded to half as stage_input rounds its floats.
__device__ __forceinline__ void stage_source(const float *blended, const Tap *rows, unsigned short *x1, int warp,
                                             int lane) {
    for (int row = warp; row < kH; row += WARPS) {
        const Tap r = rows[row];
        const float *top = blended + r.lo * kW, *bottom = blended + r.hi * kW;
        unsigned *dst = reinterpret_cast<unsigned *>(x1 + row * 2 * PW1);
#pragma unroll
        for (int p0 = 0; p0 < PW1 / 2; p0 += 32) {
            const int j = 2 * (p0 + lane);
            float2 v = make_float2(0.f, 0.f);
            if (j < kW) {
                const float2 t = *reinterpret_cast<const float2 *>(top + j), b = *reinterpret_cast<const float2 *>(bottom + j);
                v = make_float2(input_value(r, t.x, b.x), input_value(r, t.y, b.y));
            }
            float next = __shfl_down_sync(0xffffffffu, v.x, 1);  // x[j + 2]
            if (lane == 31) next = j + 2 < kW ? input_value(r, top[j + 2], bottom[j + 2]) : 0.f;
            if (p0 + lane < PW1 / 2) {
                dst[p0 + lane] = pack_half2(v.x, v.y);
                dst[PW1 / 2 + p0 + lane] = pack_half2(v.y, next);
            }
        }
    }
}
#endif

// conv1's B fragment f (input rows 2f, 2f + 1 of a row pair) for this lane: column n = g is map
// g % 4 of conv row g / 4; k 2t, 2t+1 (b.x) kernel columns of the first row, k 2t+8.. (b.y) of the second.
__device__ uint2 conv1_fragment(const float *__restrict__ k, int f, int lane) {
    const int g = lane >> 2, t = lane & 3, m = g % M1, dr = g / M1;
    unsigned h[2];
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const int ky = 2 * f + p - dr;
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) v[j] = ky >= 0 && ky < kK && 2 * t + j < kK ? k[(m * kK + ky) * kK + 2 * t + j] : 0.f;
        h[p] = pack_half2(v[0], v[1]);
    }
    return make_uint2(h[0], h[1]);
}

// conv2's B fragment f = (channel pair cp, kernel row d, map block nb): column n = g is map nb * 8 + g;
// k 0-7 (b.x) kernel columns of channel 2 cp, k 8-15 (b.y) of channel 2 cp + 1.
__device__ uint2 conv2_fragment(const float *__restrict__ k, int f, int lane) {
    const int g = lane >> 2, t = lane & 3, nb = f % (M2 / 8), d = f / (M2 / 8) % K2, cp = f / (M2 / 8 * K2);
    const int m = nb * 8 + g;
    unsigned h[2];
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
            v[j] = 2 * t + j < K2 ? k[((m * M1 + 2 * cp + p) * K2 + d) * K2 + 2 * t + j] : 0.f;
        h[p] = pack_half2(v[0], v[1]);
    }
    return make_uint2(h[0], h[1]);
}

// raw (fp32 [kH][kW]) -> x1 [row][copy][PW1] fp16: copy 0 holds x[j], copy 1 x[j + 1], zero past W.
// A warp per row, a column pair per lane: one 64-bit load (x[j + 2] is the next lane's), two
// 32-bit stores. Lanes 0-31 cover 64 columns per pass, and a pass's last lane reads its x[j + 2].
__device__ __forceinline__ void stage_input(const float *raw, unsigned short *x1, int warp, int lane) {
    static_assert(kW % 2 == 0, "rows of whole float2 pairs");
    for (int row = warp; row < kH; row += WARPS) {
        const float *src = raw + row * kW;
        unsigned *dst = reinterpret_cast<unsigned *>(x1 + row * 2 * PW1);
#pragma unroll
        for (int p0 = 0; p0 < PW1 / 2; p0 += 32) {
            const int j = 2 * (p0 + lane);
            const float2 v = j < kW ? *reinterpret_cast<const float2 *>(src + j) : make_float2(0.f, 0.f);
            float next = __shfl_down_sync(0xffffffffu, v.x, 1);  // x[j + 2]
            if (lane == 31) next = j + 2 < kW ? src[j + 2] : 0.f;
            if (p0 + lane < PW1 / 2) {
                dst[p0 + lane] = pack_half2(v.x, v.y);
                dst[PW1 / 2 + p0 + lane] = pack_half2(v.y, next);
            }
        }
    }
}

// conv1 + bias + ReLU + 2x2 pool: ROWS1 consecutive pooled rows per warp, one 16-pixel tile at a
// time: the tile's row pairs are loaded once each and feed every pooled row they belong to (1.6
// shared loads per mma instead of 4), with the four B fragments in registers.
__device__ __forceinline__ void conv1(const unsigned short *x1, unsigned short *x2, const uint2 *b1,
                                      const float *__restrict__ bias, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3, ph0 = warp * ROWS1;
    uint2 b[F1];
#pragma unroll
    for (int f = 0; f < F1; ++f) b[f] = b1[f * 32 + lane];
    // Pool: pixels 2g, 2g+1 are this thread's (d0/d2, d1/d3); the conv row pair is lanes t ^ 2.
    // Then lanes t, t ^ 2 hold maps 2 (t & 1) + 0/1: lane t stores the one of index t >> 1.
    const int m = 2 * (t & 1) + (t >> 1);
    const float bm = __ldg(bias + m);
#pragma unroll 1
    for (int i = 0; i < TILES1; ++i) {
        float acc[ROWS1][4];
#pragma unroll
        for (int j = 0; j < ROWS1; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        const unsigned short *base = x1 + 2 * ph0 * 2 * PW1 + 16 * i + 2 * (g + t);
#pragma unroll
        for (int p = 0; p < ROWS1 + F1 - 1; ++p) {  // input rows 2 (ph0 + p), + 1
            const unsigned short *row = base + 2 * p * 2 * PW1;
            const unsigned a0 = lds32(row), a1 = lds32(row + PW1), a2 = lds32(row + 2 * PW1), a3 = lds32(row + 3 * PW1);
#pragma unroll
            for (int j = 0; j < ROWS1; ++j) {  // pooled row ph0 + j reads pairs j .. j + F1 - 1
                const int f = p - j;
                if (f >= 0 && f < F1) mma_f16_k16(acc[j], a0, a1, a2, a3, b[f].x, b[f].y);
            }
        }
        const int pc = 8 * i + g;
#pragma unroll
        for (int j = 0; j < ROWS1; ++j) {
            float h0 = max_nan(acc[j][0], acc[j][2]), h1 = max_nan(acc[j][1], acc[j][3]);
            h0 = max_nan(h0, __shfl_xor_sync(0xffffffffu, h0, 2));
            h1 = max_nan(h1, __shfl_xor_sync(0xffffffffu, h1, 2));
            if (pc >= WP1) continue;
            const float s = (t >> 1 ? h1 : h0) + bm;
            const unsigned short v = to_half(s < 0.f ? 0.f : s);  // NaN stays NaN
            unsigned short *dst = x2 + m * CH2 + (ph0 + j) * 2 * PW2;
            dst[pc] = v;
            if (pc > 0) dst[PW2 + pc - 1] = v;
        }
    }
}

// conv2 + bias + ReLU + 4x4 pool into the image's flattened features: pooled row ph per warp, both
// map blocks, its four conv rows as four accumulators; a channel pair per mma, the pair's 14 B
// fragments in registers (each used by both tiles and all four conv rows).
__device__ __forceinline__ void conv2(const unsigned short *x2, unsigned short *feat, const uint2 *b2,
                                      const float *__restrict__ bias, int warp, int lane) {
    constexpr int NB = M2 / 8, BAND = 4 + K2 - 1;  // map blocks; input rows of a pooled row
    const int g = lane >> 2, t = lane & 3;
    for (int ph = warp; ph < HP2; ph += WARPS) {
        float acc[4][TILES2][NB][4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < TILES2; ++i)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) acc[q][i][nb][0] = acc[q][i][nb][1] = acc[q][i][nb][2] = acc[q][i][nb][3] = 0.f;
#pragma unroll 1
        for (int cp = 0; cp < M1 / 2; ++cp) {
            uint2 b[K2][NB];
#pragma unroll
            for (int d = 0; d < K2; ++d)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) b[d][nb] = b2[((cp * K2 + d) * NB + nb) * 32 + lane];
            const unsigned short *base = x2 + 2 * cp * CH2 + 4 * ph * 2 * PW2 + 2 * (g + t);
#pragma unroll
            for (int r = 0; r < BAND; ++r) {
                unsigned a[TILES2][4];
#pragma unroll
                for (int i = 0; i < TILES2; ++i) {
                    const unsigned short *row = base + r * 2 * PW2 + 16 * i;
                    a[i][0] = lds32(row), a[i][1] = lds32(row + PW2), a[i][2] = lds32(row + CH2), a[i][3] = lds32(row + CH2 + PW2);
                }
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int d = r - q;
                    if (d < 0 || d >= K2) continue;
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                        for (int i = 0; i < TILES2; ++i)
                            mma_f16_k16(acc[q][i][nb], a[i][0], a[i][1], a[i][2], a[i][3], b[d][nb].x, b[d][nb].y);
                }
            }
        }
        // Pool: the four conv rows in registers, pixel pairs in-thread, pixel quads lanes g ^ 1 (which
        // then hold the same two maps 2t, 2t + 1: lane g stores the one of index g & 1).
#pragma unroll
        for (int i = 0; i < TILES2; ++i) {
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    v[e] = max_nan(max_nan(acc[0][i][nb][e], acc[1][i][nb][e]), max_nan(acc[2][i][nb][e], acc[3][i][nb][e]));
                float h0 = max_nan(v[0], v[2]), h1 = max_nan(v[1], v[3]);
                h0 = max_nan(h0, __shfl_xor_sync(0xffffffffu, h0, 4));
                h1 = max_nan(h1, __shfl_xor_sync(0xffffffffu, h1, 4));
                const int pc = (16 * i + 2 * g) / 4, m = nb * 8 + 2 * t + (g & 1);
                if (pc >= WP2) continue;
                const float s = (g & 1 ? h1 : h0) + __ldg(bias + m);
                feat[(m * HP2 + ph) * WP2 + pc] = to_half(s < 0.f ? 0.f : s);
            }
        }
    }
}

}  // namespace

#if SRC_H_FIXED > 0
// CONV_ARGS with x the stored bytes; after the others, upsample_u8's ratios and divisor (LayerKind absorbed_args).
#define NETWORK_ARGS                                                                                           \
    conv_t *__restrict__ y, const unsigned char *__restrict__ x, const conv_t *__restrict__ k,                 \
        const conv_t *__restrict__ bias, int B, int C, int M, int H, int W, int K, int S
#define ABSORBED_ARGS , double ratio_h, double ratio_w, float divisor
#else
#define NETWORK_ARGS CONV_ARGS
#define ABSORBED_ARGS
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 2)
network_forward(NETWORK_ARGS, POOL_ARGS, FUSED_WEIGHTS(conv2), FUSED_WEIGHTS(fc1), FUSED_WEIGHTS(fc2) ABSORBED_ARGS) {
    (void)C, (void)M, (void)H, (void)W, (void)K, (void)S, (void)P, (void)PS;
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    if (dynamic_bytes < SHARED_BYTES) return;  // the launch gave too little: the logits stay poisoned
    extern __shared__ __align__(16) unsigned char smem[];
#if SRC_H_FIXED > 0
    unsigned char *raw = smem;
    float *quotient = reinterpret_cast<float *>(smem + RAW_BYTES);
    Tap *taps = reinterpret_cast<Tap *>(smem + RAW_BYTES + QUOTIENT_BYTES);
    float *blended = reinterpret_cast<float *>(smem + RAW_BYTES + QUOTIENT_BYTES + TAP_BYTES);
#else
    float *raw = reinterpret_cast<float *>(smem);
#endif
    unsigned short *x1 = reinterpret_cast<unsigned short *>(smem + INPUT_BYTES);
    unsigned short *x2 = reinterpret_cast<unsigned short *>(smem + INPUT_BYTES + X1_BYTES);
    uint2 *b1 = reinterpret_cast<uint2 *>(smem + INPUT_BYTES + X1_BYTES + X2_BYTES);
    uint2 *b2 = b1 + 32 * F1;
    unsigned short *feat = reinterpret_cast<unsigned short *>(b2 + 32 * F2);
    float *part = reinterpret_cast<float *>(x1);  // the dense phase's sums: x1 is idle until the next image

    const int share = (B + gridDim.x - 1) / gridDim.x, first = blockIdx.x * share, count = min(share, B - first);
    if (count <= 0) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if SRC_H_FIXED > 0
    load_image(raw, x + image_offset(first, 1, kSH, kSW));
    source_setup(quotient, taps, ratio_h, ratio_w, divisor);
#else
    load_image(raw, x + image_offset(first, 1, kH, kW));
#endif
    for (int e = threadIdx.x; e < 32 * F1; e += THREADS) b1[e] = conv1_fragment(k, e >> 5, e & 31);
    for (int e = threadIdx.x; e < 32 * F2; e += THREADS) b2[e] = conv2_fragment(conv2_w, e >> 5, e & 31);
    for (int e = threadIdx.x; e < X2_BYTES / 4; e += THREADS) reinterpret_cast<unsigned *>(x2)[e] = 0u;  // unwritten columns read 0

    for (int n = 0; n < count; ++n) {
        wait_image();
        __syncthreads();  // raw holds image n; the previous image's phases are done with x1, x2
#if SRC_H_FIXED > 0
        blend_columns(raw, quotient, taps + kH, blended);
        __syncthreads();
        if (n + 1 < count) load_image(raw, x + image_offset(first + n + 1, 1, kSH, kSW));  // lands during this image
        stage_source(blended, taps, x1, warp, lane);
        __syncthreads();
#else
        stage_input(raw, x1, warp, lane);
        __syncthreads();
        if (n + 1 < count) load_image(raw, x + image_offset(first + n + 1, 1, kH, kW));  // lands during this image
#endif
        conv1(x1, x2, b1, bias, warp, lane);
        __syncthreads();
        conv2(x2, feat + n % GROUP * FEAT_STRIDE, b2, conv2_b, warp, lane);
        if (n % GROUP == GROUP - 1 || n == count - 1) {
            __syncthreads();
            const int group_first = n - n % GROUP;
            // The group's images are consecutive: image i's logits are row i from the group's first.
            dense<WARPS, GROUP, FEAT, FEAT_STRIDE, N1, N2>(feat, part, fc1_w, fc1_b, fc2_w, fc2_b,
                                                         y + (long long)(first + group_first) * N2,
                                                         [](int img) { return img; }, n % GROUP + 1, warp, lane);
        }
    }
}
