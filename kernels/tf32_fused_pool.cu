// tf32_fused_pool: conv + bias + ReLU + max-pool in one kernel (the semantics of
// fused_conv_relu_pool.cu) with the conv on TENSOR CORES in TF32: inline PTX
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (fp32 accumulate, operands rounded with
// cvt.rna.tf32.f32).
//
// Implicit GEMM per block: D[m][n] = sum_r A[m][r] * B[r][n], r = (c, p, q) padded to R_pad =
// 8 * ceil(C*K*K / 8) with zero weights; A = 16 maps (grid.y = ceil(M / 16); maps past M have
// zero weights and are not stored); n = conv output pixels in POOL-WINDOW-MAJOR order:
// column = window * P*P + (i * P + j), window = local pooled row * W_pool + pooled column.
// Mapping: grid.x = B * ceil(H_pool / PR): block = one image's band of PR pooled rows (all
// W_pool windows of each); the band's input patch (C x ROWS x W, ROWS = ((PR-1)*PS + P-1)*S + K,
// at most H) is staged in shared memory, with the block's A in mma fragment order and a table
// off[r] = (c*ROWS + p)*W + q. WARPS warps take units of NT n8-tiles (8*NT columns) round-robin.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32; g = lane/4, t = lane%4):
//   A 16x8 row: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
//   B 8x8 col:  b0 (k=t, n=g), b1 (k=t+4, n=g)
//   C/D 16x8:   c0,c1 (g, 2t + 0/1), c2,c3 (g+8, 2t + 0/1)
// So A is one conflict-free LDS.128 per k-step (staged as [k-step][lane][a0..a3]); B is the
// thread's column origin (computed once per unit) + off[k] -> 2 LDS per mma (x is staged as tf32).
//
// Pool in registers: with window-major columns a window is P*P consecutive columns. P = 2: a
// tile holds 2 windows, lanes t = {0,1} and {2,3}: max of the thread's 2 columns, shfl_xor 1.
// P = 4: a window is a pair of tiles: max of 2 columns, shfl_xor 1 and 2, max of the 2 tiles.
// That is why P*P must be 4 or 16 (a window must be a power-of-two group of a tile's lanes or a
// whole even/odd tile pair; P = 3's 9 columns straddle tiles unevenly). PS and S are general
// (each column's pixel origin is computed from them; PS < P just recomputes shared pixels).
// Bias and ReLU come after the max (constant bias, monotone relu: same result as relu per pixel
// then max), NaN-preserving as in fused_conv_relu_pool (max keeps NaN, relu is v < 0 ? 0 : v).
// In floor mode every pixel of a real window is inside the conv output; only windows past
// H_pool (last band) or past the band's last tile are masked: origin 0 (in-bounds reads), no store.
//
// Why faster than fused_conv_relu_pool (1.58 ms on LeNet conv2 at B=10000, FMA-bound): the
// 16 x 8 x 8 mma replaces 1024 FFMAs; the cost per mma is ~2 LDS per thread for B (x is rounded
// to tf32 once, when staged) plus 1/NT LDS.128 for A, so the bound becomes shared-memory issue
// (~1 LDS/clk/SM): ~0.3 ms predicted for conv2 (25 k-steps x 128 tiles x 10000 images), over the
// 0.16 ms tf32 mma floor. Measured on the H100 (bench, B=10000): 1.09 ms with a cvt per use, the
// ALU pipe (address arithmetic and cvt) 70% busy and occupancy 50% (ncu).
// Tunables: WARPS (warps per block), NT (n8-tiles per warp unit: A-fragment reuse and
// independent mmas in flight; even, so a P=4 window never straddles units), PR (pooled rows per
// block: the staged patch's height, and the block's amount of work).
#include "common.cuh"

#ifndef WARPS
#define WARPS 8
#endif
#ifndef NT
#define NT 4
#endif
#ifndef PR
#define PR 8
#endif

static_assert(sizeof(conv_t) == 4, "tf32_fused_pool is written for float32");
static_assert(NT % 2 == 0, "a P=4 window spans an even/odd tile pair");
static_assert(PR % 2 == 0, "P=2: PR * W_pool * 4 columns must fill whole n8 tiles");

namespace {

__device__ __forceinline__ unsigned to_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint4 &a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float max_nan(float m, float v) { return (v > m || v != v) ? v : m; }

// One k-step for the NT tiles of a unit. MASK (last k-step only): rows r >= R read 0, not the
// patch, so an Inf input cannot turn a zero-padded weight into 0 * Inf = NaN.
template <bool MASK>
__device__ __forceinline__ void k_step(float (&acc)[NT][4], const uint4 *__restrict__ a_s,
                                       const int *__restrict__ off_s, const float *__restrict__ x_s,
                                       const int (&origin)[NT], int ks, int lane, int R) {
    const int t = lane & 3;
    const uint4 a = a_s[ks * 32 + lane];
    const int r0 = ks * 8 + t, o0 = off_s[r0], o1 = off_s[r0 + 4];
    const bool v0 = !MASK || r0 < R, v1 = !MASK || r0 + 4 < R;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const unsigned b0 = v0 ? __float_as_uint(x_s[origin[i] + o0]) : 0u;  // already tf32 (staged so)
        const unsigned b1 = v1 ? __float_as_uint(x_s[origin[i] + o1]) : 0u;
        mma_tf32(acc[i], a, b0, b1);
    }
}

__device__ __forceinline__ void store(conv_t *__restrict__ y, const conv_t *__restrict__ bias, float pooled, int m,
                                      long long base, int plane, int pixel) {
    const float v = pooled + bias[m];
    y[base + (long long)m * plane + pixel] = v < 0.f ? 0.f : v;  // NaN stays NaN
}

template <int P>
__device__ __forceinline__ void compute(conv_t *__restrict__ y, const conv_t *__restrict__ bias, const uint4 *a_s,
                                        const int *off_s, const float *x_s, int b, int band, int m0, int M, int R,
                                        int KS, int W, int S, int PS, int H_pool, int W_pool, int ROWS) {
    constexpr int PP = P * P;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int windows = PR * W_pool;           // windows of the band (some past H_pool in the last band)
    const int tiles = windows * PP / 8;        // exact: PP = 16, or PP = 4 with PR even
    const int units = (tiles + NT - 1) / NT;
    const int plane = H_pool * W_pool;
    const long long ybase = image_offset(b, M, H_pool, W_pool);
    (void)ROWS;

    for (int u = warp; u < units; u += WARPS) {
        int origin[NT];
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const int col = (u * NT + i) * 8 + g;  // this lane's B column (n = g)
            const int wl = col / PP, pos = col % PP;
            const int pr = wl / W_pool, pw = wl % W_pool;
            const bool valid = wl < windows && band * PR + pr < H_pool;
            origin[i] = valid ? (pr * PS + pos / P) * S * W + (pw * PS + pos % P) * S : 0;
        }
        float acc[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

#pragma unroll 2
        for (int ks = 0; ks < KS - 1; ++ks) k_step<false>(acc, a_s, off_s, x_s, origin, ks, lane, R);
        k_step<true>(acc, a_s, off_s, x_s, origin, KS - 1, lane, R);

        // Pool: lo = map m0+g (c0, c1), hi = map m0+g+8 (c2, c3).
        float lo[NT], hi[NT];
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            lo[i] = max_nan(acc[i][0], acc[i][1]);
            hi[i] = max_nan(acc[i][2], acc[i][3]);
#pragma unroll
            for (int d = 1; d < (PP == 16 ? 4 : 2); d <<= 1) {  // lanes of a window in a tile: P=2: xor 1; P=4: xor 1, 2
                lo[i] = max_nan(lo[i], __shfl_xor_sync(0xffffffffu, lo[i], d));
                hi[i] = max_nan(hi[i], __shfl_xor_sync(0xffffffffu, hi[i], d));
            }
        }
#pragma unroll
        for (int i = 0; i < NT; i += (PP == 16 ? 2 : 1)) {
            float l = lo[i], h = hi[i];
            if (PP == 16) l = max_nan(l, lo[i + 1]), h = max_nan(h, hi[i + 1]);
            const bool leader = PP == 16 ? t == 0 : (t & 1) == 0;
            const int wl = ((u * NT + i) * 8 + 2 * t) / PP;  // window of this lane's columns
            const int ph = band * PR + wl / W_pool, pw = wl % W_pool;
            if (leader && wl < windows && ph < H_pool) {
                const int pixel = ph * W_pool + pw;
                if (m0 + g < M) store(y, bias, l, m0 + g, ybase, plane, pixel);
                if (m0 + g + 8 < M) store(y, bias, h, m0 + g + 8, ybase, plane, pixel);
            }
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(WARPS * 32) conv_relu_pool_tf32(CONV_ARGS, POOL_ARGS) {
    extern __shared__ __align__(16) unsigned smem[];
    const int R = C * K * K, KS = (R + 7) / 8;
    const int H_out = (H - K) / S + 1, W_out = (W - K) / S + 1;
    const int H_pool = (H_out - P) / PS + 1, W_pool = (W_out - P) / PS + 1;
    const int ROWS = min(((PR - 1) * PS + P - 1) * S + K, H);  // staged input rows (registry shared_bytes)
    uint4 *a_s = reinterpret_cast<uint4 *>(smem);              // [KS][32 lanes] {a0, a1, a2, a3}
    int *off_s = reinterpret_cast<int *>(smem + KS * 128);     // [KS * 8]
    float *x_s = reinterpret_cast<float *>(off_s + KS * 8);    // [C][ROWS][W]

    const int bands = (H_pool + PR - 1) / PR;
    const int b = blockIdx.x / bands, band = blockIdx.x % bands;
    const int m0 = blockIdx.y * 16;

    for (int e = threadIdx.x; e < KS * 128; e += WARPS * 32) {
        const int ks = e >> 7, ln = (e >> 2) & 31, j = e & 3;
        const int row = (ln >> 2) + (j & 1) * 8, col = ks * 8 + (ln & 3) + (j >> 1) * 4;
        const float v = (m0 + row < M && col < R) ? k[(long long)(m0 + row) * R + col] : 0.f;
        smem[e] = to_tf32(v);
    }
    for (int r = threadIdx.x; r < KS * 8; r += WARPS * 32) {
        const int c = r / (K * K), p = (r / K) % K, q = r % K;
        off_s[r] = r < R ? (c * ROWS + p) * W + q : 0;
    }
    const int row0 = band * PR * PS * S;
    const conv_t *__restrict__ xb = x + image_offset(b, C, H, W);
    for (int e = threadIdx.x; e < C * ROWS * W; e += WARPS * 32) {
        const int c = e / (ROWS * W), rem = e % (ROWS * W), row = row0 + rem / W, col = rem % W;
        // Rounded to tf32 here, once per element, instead of once per use in the k-loop (each element
        // feeds up to K*K mma columns; ncu showed the ALU pipe, where cvt runs, as the busiest at 70%).
        // Rows past H feed masked windows only.
        x_s[e] = __uint_as_float(to_tf32(row < H ? __ldg(xb + (c * H + row) * W + col) : 0.f));
    }
    __syncthreads();

    if (P == 2)
        compute<2>(y, bias, a_s, off_s, x_s, b, band, m0, M, R, KS, W, S, PS, H_pool, W_pool, ROWS);
    else
        compute<4>(y, bias, a_s, off_s, x_s, b, band, m0, M, R, KS, W, S, PS, H_pool, W_pool, ROWS);
}
