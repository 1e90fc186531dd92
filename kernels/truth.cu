// The harness's own kernels, never a variant's (convsweep/device/truth.py and convsweep/device/rounds.py launch them):
// - the float64 truth: each layer kind of convsweep/model/layers.py computed in double on exactly what was
//   shipped, after the candidate's pass and outside its timing;
// - the rounds: a batch of the dataset's images, each perturbed from a seed drawn at run time
//   (`perturb_*`), so no kernel has seen them before the pass that times it;
// - the comparisons: the candidate's output against the truth, image by image (`compare_*`), and each
//   round's truth against every earlier sighting of the same image (`sight`, `freshness`).
//
// Deliberately simple: one thread per output (per group of channels and positions in conv2d_f64), a fixed
// order of summation, no shared memory, no atomics, no block-wide synchronization. So each run gives the
// same bits, and the same source compiles as plain C++ on the host (tests/host_kernels.py), where the CPU
// tests hold it to numpy's float64 reference (convsweep/model/reference.py).
#ifndef CONVSWEEP_HOST
#include <cuda_fp16.h>
#endif

typedef long long i64;
typedef unsigned long long u64;

// Every kernel here strides over its outputs: any grid covers any size.
#define EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ double to_double(unsigned char v) { return (double)v; }
__device__ __forceinline__ double to_double(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double to_double(float v) { return (double)v; }
__device__ __forceinline__ double to_double(double v) { return v; }

// -- the input's first layer: what the device makes of what was shipped (convert, upsample) ------------------
template <typename T>
__device__ __forceinline__ void convert(double *__restrict__ y, const T *__restrict__ x, i64 n, double divisor) {
    EACH(i, n) y[i] = to_double(x[i]) / divisor;
}
extern "C" __global__ void convert_u8_f64(double *y, const unsigned char *x, i64 n, double divisor) { convert(y, x, n, divisor); }
extern "C" __global__ void convert_f16_f64(double *y, const __half *x, i64 n, double divisor) { convert(y, x, n, divisor); }
extern "C" __global__ void convert_f32_f64(double *y, const float *x, i64 n, double divisor) { convert(y, x, n, divisor); }
extern "C" __global__ void convert_f64_f64(double *y, const double *x, i64 n, double divisor) { convert(y, x, n, divisor); }

// The bilinear source of output i of n_out from n_in (half-pixel centres, the first centre clamped), as
// convsweep.model.layers.bilinear_matrix builds it.
__device__ __forceinline__ void bilinear(int i, int n_in, int n_out, int &lo, int &hi, double &frac) {
    double src = ((double)i + 0.5) * ((double)n_in / (double)n_out) - 0.5;
    if (src < 0.0) src = 0.0;
    lo = (int)floor(src);
    if (lo > n_in - 1) lo = n_in - 1;
    hi = lo + 1 < n_in ? lo + 1 : n_in - 1;
    frac = src - (double)lo;
}

// y[plane][r][c] = clip(sum of the 2x2 sources, each x / divisor, weighted bilinearly, to [0, 1]).
extern "C" __global__ void upsample_u8_f64(double *__restrict__ y, const unsigned char *__restrict__ x, i64 planes,
                                           int h, int w, int out_h, int out_w, double divisor) {
    EACH(i, planes * out_h * out_w) {
        const int c = (int)(i % out_w), r = (int)((i / out_w) % out_h);
        const i64 plane = i / ((i64)out_w * out_h);
        int r0, r1, c0, c1;
        double fr, fc;
        bilinear(r, h, out_h, r0, r1, fr);
        bilinear(c, w, out_w, c0, c1, fc);
        const unsigned char *p = x + plane * h * w;
        const double top = (1.0 - fc) * (p[r0 * w + c0] / divisor) + fc * (p[r0 * w + c1] / divisor);
        const double bottom = (1.0 - fc) * (p[r1 * w + c0] / divisor) + fc * (p[r1 * w + c1] / divisor);
        const double v = (1.0 - fr) * top + fr * bottom;
        y[i] = v < 0.0 ? 0.0 : (v > 1.0 ? 1.0 : v);
    }
}

// -- the network's layers in float64 ---------------------------------------------------------------------------
// y[b][m][h][w] = bias[m] + sum over c, p, q of x[b][c][h*S+p][w*S+q] * k[m][c][p][q], in that order. A thread
// keeps MG output channels of PW neighbouring positions of a row in registers: each weight it loads feeds PW
// multiply-adds and each input MG, so the float64 units, not the loads, set its pace. Consecutive threads are
// neighbouring groups of positions: the weights they read are the same for the whole warp. M is a multiple of MG;
// a row's last group computes past its end on clamped columns and stores only what is inside. KK: the kernel's
// size where it is known when compiling (its loop is then unrolled), 0 for any (K).
template <int MG, int PW, int KK>
__device__ __forceinline__ void conv2d(double *__restrict__ y, const double *__restrict__ x, const double *__restrict__ k,
                                       const double *__restrict__ bias, int B, int C, int M, int H, int W, int K_, int S) {
    const int K = KK ? KK : K_;
    const int H_out = (H - K) / S + 1, W_out = (W - K) / S + 1, groups = M / MG, tiles = (W_out + PW - 1) / PW;
    EACH(i, (i64)B * groups * H_out * tiles) {
        const int wo = (int)(i % tiles) * PW, ho = (int)((i / tiles) % H_out), g = (int)((i / ((i64)tiles * H_out)) % groups);
        const i64 b = i / ((i64)tiles * H_out * groups);
        const int m0 = g * MG;
        int column[PW];
#pragma unroll
        for (int t = 0; t < PW; ++t) column[t] = (wo + t < W_out ? wo + t : W_out - 1) * S;
        double acc[MG][PW];
#pragma unroll
        for (int j = 0; j < MG; ++j)
#pragma unroll
            for (int t = 0; t < PW; ++t) acc[j][t] = bias[m0 + j];
        const double *xb = x + b * C * H * W + (i64)(ho * S) * W;
        const double *kb = k + (i64)m0 * C * K * K;
        for (int c = 0; c < C; ++c)
            for (int p = 0; p < K; ++p) {
                const double *row = xb + ((i64)c * H + p) * W;
                const double *kr = kb + ((i64)c * K + p) * K;
#pragma unroll
                for (int q = 0; q < K; ++q) {
                    double v[PW];
#pragma unroll
                    for (int t = 0; t < PW; ++t) v[t] = row[column[t] + q];
#pragma unroll
                    for (int j = 0; j < MG; ++j) {
                        const double w = kr[(i64)j * C * K * K + q];
#pragma unroll
                        for (int t = 0; t < PW; ++t) acc[j][t] += v[t] * w;
                    }
                }
            }
#pragma unroll
        for (int j = 0; j < MG; ++j)
#pragma unroll
            for (int t = 0; t < PW; ++t)
                if (wo + t < W_out) y[((b * M + m0 + j) * H_out + ho) * W_out + wo + t] = acc[j][t];
    }
}
#define CONV2D_F64(MG, PW, KK)                                                                                 \
    extern "C" __global__ void conv2d_f64_##MG##x##PW##_k##KK(double *y, const double *x, const double *k,       \
                                                              const double *bias, int B, int C, int M, int H, int W, \
                                                              int K, int S) {                                        \
        conv2d<MG, PW, KK>(y, x, k, bias, B, C, M, H, W, K, S);                                                      \
    }
// Every group of channels that divides a layer's M, two positions a thread, at K = 5 and 7 (LeNet-86's, conv256's,
// fp64_stride5's) and any K. Chosen on the lent H100 (docs/performance.md, "What checking every pass costs"): on
// one chunk of 1310 LeNet-86 images conv2 16x2 at K 7 took 0.934 ms, 8x4 at any K 1.359, 16x4 spills; conv1 4x2 at
// K 7 0.457 ms, 4x4 0.532. Every shape gave the same bits.
#define CONV2D_F64_K(MG) CONV2D_F64(MG, 2, 0) CONV2D_F64(MG, 2, 5) CONV2D_F64(MG, 2, 7)
CONV2D_F64_K(1)
CONV2D_F64_K(2)
CONV2D_F64_K(4)
CONV2D_F64_K(8)
CONV2D_F64_K(16)

extern "C" __global__ void relu_f64(double *x, i64 n) {
    EACH(i, n) if (x[i] < 0.0) x[i] = 0.0;  // NaN stays NaN
}

// y[bc][h][w] = max over a size x size window at `stride` (floor mode); NaN wins, as numpy's maximum.
extern "C" __global__ void maxpool_f64(double *__restrict__ y, const double *__restrict__ x, i64 BC, int H, int W,
                                       int size, int stride) {
    const int H_out = (H - size) / stride + 1, W_out = (W - size) / stride + 1;
    EACH(i, BC * H_out * W_out) {
        const int w = (int)(i % W_out), h = (int)((i / W_out) % H_out);
        const double *plane = x + (i / ((i64)W_out * H_out)) * H * W + (i64)h * stride * W + w * stride;
        double m = plane[0];
        for (int p = 0; p < size; ++p)
            for (int q = 0; q < size; ++q) {
                const double v = plane[p * W + q];
                m = (v > m || v != v) ? v : m;
            }
        y[i] = m;
    }
}

// y[b][j] = sum over i of x[b][i] * wt[i][j], then + bias[j] (numpy's x @ w.T + bias; wt is w transposed, as
// convsweep.device.truth uploads it). Consecutive threads are consecutive outputs j of one image: x is the same for
// the whole warp, and its reads of wt are contiguous (0.176 ms against 0.295 for w's rows, fc1 of 1310 images).
extern "C" __global__ void dense_f64(double *__restrict__ y, const double *__restrict__ x, const double *__restrict__ wt,
                                     const double *__restrict__ bias, int B, int in_features, int out_features) {
    EACH(t, (i64)B * out_features) {
        const int j = (int)(t % out_features);
        const i64 b = t / out_features;
        const double *xb = x + b * in_features;
        double acc = 0.0;
        for (int i = 0; i < in_features; ++i) acc += xb[i] * wt[(i64)i * out_features + j];
        y[t] = acc + bias[j];
    }
}

// -- the candidate's output against the truth, per image --------------------------------------------------------
// Two passes, no synchronization: each of P parts of an image reduces its share into parts[b][p][7], then one
// thread per image reduces its parts into rows[b][5]: max |y - ref| over the finite pairs, max |ref|, the first
// index of y's largest value, that of ref's, and how many of y's elements are not finite (unwritten or
// overflowed). numpy's argmax takes the first of equal values: so do the parts, in order.
#define PART_FIELDS 7
#define ROW_FIELDS 5
template <typename T>
__device__ __forceinline__ void compare_parts(double *__restrict__ parts, const T *__restrict__ y,
                                              const double *__restrict__ ref, int B, i64 per_image, int P) {
    const i64 chunk = (per_image + P - 1) / P;
    EACH(t, (i64)B * P) {
        const int p = (int)(t % P);
        const i64 b = t / P, lo = p * chunk, hi = lo + chunk < per_image ? lo + chunk : per_image;
        double diff = 0.0, scale = 0.0, y_best = 0.0, ref_best = 0.0, bad = 0.0;
        i64 y_at = -1, ref_at = -1;
        for (i64 e = lo; e < hi; ++e) {
            const double v = to_double(y[b * per_image + e]), r = ref[b * per_image + e];
            const double a = r < 0.0 ? -r : r;
            if (a > scale) scale = a;
            if (ref_at < 0 || r > ref_best) { ref_best = r; ref_at = e; }
            if (v - v != 0.0) { bad += 1.0; continue; }  // NaN or infinite
            const double d = v > r ? v - r : r - v;
            if (d > diff) diff = d;
            if (y_at < 0 || v > y_best) { y_best = v; y_at = e; }
        }
        double *out = parts + t * PART_FIELDS;
        out[0] = diff; out[1] = scale; out[2] = y_best; out[3] = (double)y_at;
        out[4] = ref_best; out[5] = (double)ref_at; out[6] = bad;
    }
}
extern "C" __global__ void compare_parts_f32(double *parts, const float *y, const double *ref, int B, i64 per_image,
                                             int P) { compare_parts(parts, y, ref, B, per_image, P); }
extern "C" __global__ void compare_parts_f64(double *parts, const double *y, const double *ref, int B, i64 per_image,
                                             int P) { compare_parts(parts, y, ref, B, per_image, P); }

extern "C" __global__ void compare_rows(double *__restrict__ rows, const double *__restrict__ parts, int B, int P) {
    EACH(b, B) {
        double diff = 0.0, scale = 0.0, y_best = 0.0, ref_best = 0.0, bad = 0.0, y_at = -1.0, ref_at = -1.0;
        for (int p = 0; p < P; ++p) {
            const double *in = parts + ((i64)b * P + p) * PART_FIELDS;
            if (in[0] > diff) diff = in[0];
            if (in[1] > scale) scale = in[1];
            if (in[3] >= 0.0 && (y_at < 0.0 || in[2] > y_best)) { y_best = in[2]; y_at = in[3]; }
            if (in[5] >= 0.0 && (ref_at < 0.0 || in[4] > ref_best)) { ref_best = in[4]; ref_at = in[5]; }
            bad += in[6];
        }
        double *out = rows + b * ROW_FIELDS;
        out[0] = diff; out[1] = scale; out[2] = y_at; out[3] = ref_at; out[4] = bad;
    }
}

// -- rounds: the dataset's images, each perturbed from (seed, round, position) ------------------------------------
// Per image: a shift of up to max_shift pixels each way (what comes in at the edge is blank), a gain in
// [gain_lo, 1], and a smooth field of `waves` plane waves (a few cycles across the image,
// random directions and phases) scaling the ink by up to +-field; per pixel, a jitter of up to +-jitter. A zero
// stays zero (a digit on a blank background stays one), and a value stays in [0, 1] (u8: [0, 255]).
__device__ __forceinline__ u64 mix(u64 z) {  // splitmix64's finalizer
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float uniform(u64 key) { return (float)(mix(key) >> 40) * (1.0f / 16777216.0f); }  // [0, 1)

#define MAX_WAVES 8
template <typename T>
__device__ __forceinline__ float load_value(T v);
template <> __device__ __forceinline__ float load_value(unsigned char v) { return (float)v * (1.0f / 255.0f); }
template <> __device__ __forceinline__ float load_value(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float load_value(float v) { return v; }
template <> __device__ __forceinline__ float load_value(double v) { return (float)v; }
template <typename T>
__device__ __forceinline__ T store_value(float v);
template <> __device__ __forceinline__ unsigned char store_value(float v) { return (unsigned char)rintf(v * 255.0f); }
template <> __device__ __forceinline__ __half store_value(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ float store_value(float v) { return v; }
template <> __device__ __forceinline__ double store_value(float v) { return (double)v; }

template <typename T>
__device__ __forceinline__ void perturb(T *__restrict__ out, const T *__restrict__ src, const i64 *__restrict__ source,
                                        int B, int C, int H, int W, u64 seed, u64 round, int max_shift, float gain_lo,
                                        float field, int waves, float jitter) {
    const float two_pi = 6.283185307179586f;
    const u64 round_key = mix(seed ^ mix(round));
    EACH(i, (i64)B * C * H * W) {
        const int w = (int)(i % W), h = (int)((i / W) % H), c = (int)((i / ((i64)W * H)) % C);
        const i64 b = i / ((i64)W * H * C);
        const u64 image_key = mix(round_key ^ mix((u64)b));
        const int span = 2 * max_shift + 1;
        const int dy = (int)(uniform(image_key ^ 1) * span) - max_shift, dx = (int)(uniform(image_key ^ 2) * span) - max_shift;
        const float gain = gain_lo + (1.0f - gain_lo) * uniform(image_key ^ 3);
        const int sh = h - dy, sw = w - dx;
        const float v = sh < 0 || sh >= H || sw < 0 || sw >= W ? 0.0f : load_value(src[((source[b] * C + c) * H + sh) * W + sw]);
        float scale = 1.0f;
        for (int k = 0; k < waves && k < MAX_WAVES; ++k) {
            const u64 wave_key = image_key ^ ((u64)(k + 1) << 8);
            const float fy = 6.0f * uniform(wave_key ^ 1) - 3.0f, fx = 6.0f * uniform(wave_key ^ 2) - 3.0f;
            const float phase = two_pi * uniform(wave_key ^ 3), amplitude = 2.0f * uniform(wave_key ^ 4) - 1.0f;
            scale += field / waves * amplitude * cosf(two_pi * (fy * h / H + fx * w / W) + phase);
        }
        const float u = 2.0f * uniform(image_key ^ mix((u64)(((i64)c * H + h) * W + w) + 0x1000)) - 1.0f;
        float p = v * gain * scale * (1.0f + jitter * u);
        p = p < 0.0f ? 0.0f : (p > 1.0f ? 1.0f : p);
        out[i] = v == 0.0f ? store_value<T>(0.0f) : store_value<T>(p);
    }
}
#define PERTURB_ARGS(T) T *out, const T *src, const i64 *source, int B, int C, int H, int W, u64 seed, u64 round, \
    int max_shift, float gain_lo, float field, int waves, float jitter
#define PERTURB_CALL perturb(out, src, source, B, C, H, W, seed, round, max_shift, gain_lo, field, waves, jitter)
extern "C" __global__ void perturb_u8(PERTURB_ARGS(unsigned char)) { PERTURB_CALL; }
extern "C" __global__ void perturb_f16(PERTURB_ARGS(__half)) { PERTURB_CALL; }
extern "C" __global__ void perturb_f32(PERTURB_ARGS(float)) { PERTURB_CALL; }
extern "C" __global__ void perturb_f64(PERTURB_ARGS(double)) { PERTURB_CALL; }

// -- freshness: each image's truth against every earlier sighting of its source image -----------------------------
// A sighting keeps L values of an image's truth (every stride-th of its output: all the logits of a classifier),
// in seen[slot][source][L]. `sight` writes the round's; `freshness` gives each image the smallest relative
// difference, max |a - b| / max |b|, from the sightings of its source in slots below its own (earlier rounds,
// and earlier places of the same round: a batch larger than the dataset holds each image more than once).
extern "C" __global__ void sight(double *__restrict__ seen, const double *__restrict__ truth, const i64 *__restrict__ source,
                                 const i64 *__restrict__ slot, int B, i64 per_image, int L, i64 stride, i64 sources) {
    EACH(t, (i64)B * L) {
        const int l = (int)(t % L);
        const i64 b = t / L;
        seen[(slot[b] * sources + source[b]) * L + l] = truth[b * per_image + l * stride];
    }
}

extern "C" __global__ void freshness(double *__restrict__ nearest, const double *__restrict__ seen,
                                     const i64 *__restrict__ source, const i64 *__restrict__ slot, int B, int L,
                                     i64 sources) {
    EACH(b, B) {
        const double *mine = seen + (slot[b] * sources + source[b]) * L;
        double least = 1.0e308;  // no earlier sighting: as far as can be
        for (i64 k = 0; k < slot[b]; ++k) {
            const double *earlier = seen + (k * sources + source[b]) * L;
            double diff = 0.0, scale = 0.0;
            for (int l = 0; l < L; ++l) {
                const double d = mine[l] > earlier[l] ? mine[l] - earlier[l] : earlier[l] - mine[l];
                const double a = earlier[l] < 0.0 ? -earlier[l] : earlier[l];
                if (d > diff) diff = d;
                if (a > scale) scale = a;
            }
            const double relative = scale > 0.0 ? diff / scale : diff;
            if (relative < least) least = relative;
        }
        nearest[b] = least;
    }
}
