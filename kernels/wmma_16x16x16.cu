// wmma_16x16x16: the implicit GEMM of register_tiled_gemm (Y[m, n] = sum_r Kmat[m, r] * X[r, n],
// r = (c, p, q) over R = C*K*K, n = (b, h, w) over N = B*H_out*W_out, batch in N) on the tensor
// cores through WMMA: fp16 operands, fp32 accumulators, fragment shape m16n16k16.
// Each block stages, per kBlockK-deep chunk of r, the BLOCK_M x kBlockK weight tile and the
// kBlockK x BLOCK_N gathered input tile in shared memory as half (converted from float while
// loading; rows past R, maps past M and pixels past N are zeros), then every warp multiplies its
// fragments with wmma::mma_sync. At the end a warp stores each accumulator fragment to its own
// float scratch in shared memory (aliasing the tiles; the layout of a fragment's registers is
// unspecified, so it must pass through store_matrix_sync), adds the bias and writes y (NCHW;
// only valid maps and pixels).
// Mapping: grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M)), block WARPS * 32 threads; the warps are
// spread over N first (kWarpsN = min(WARPS, BLOCK_N / 16)), then M, and each warp owns a
// kWarpFragsM x kWarpFragsN block of 16x16 output fragments.
// Expected gain over register_tiled_gemm: that kernel is FMA bound, one FFMA per multiply-add
// (an H100 SM issues 128 FFMA per clock); the tensor cores do an order of magnitude more fp16
// MACs (dense fp16 ~990 TFLOPS vs ~67 fp32; mma.sync reaches a good part of that), so the
// arithmetic becomes nearly free, and fp16 halves the tiles' shared-memory footprint. What bounds
// it then is the gather into shared memory: per chunk a thread stages kBlockK / kLoadRows * kCols
// input elements, each a scalar predicated load of x (mostly L1 hits: a value is reused by K*K
// neighbouring windows), a cvt and a 16-bit shared store, plus a RowCursor step per row; each
// staged element feeds BLOCK_M multiply-adds, on which register_tiled_gemm spends BLOCK_M FFMAs.
// Expect several x on LeNet conv2 (M = 16: 16 MACs per staged value) and little on conv1
// (M = 4: 3/4 of every 16-row fragment is zero padding, and 4 FFMAs per staged value were cheap
// already); the 256-map conv256 layer is where the tensor cores matter most (BLOCK_M = 64).
// Single-buffered: the gather's latency is hidden by other resident blocks, which the small
// shared footprint (6-14 KB) leaves room for, not by prefetching.
// Precision: inputs and weights rounded to fp16 (11-bit significand, |v| <= 65504), products
// summed in fp32: normwise error ~1e-4 to 1e-3, within the fp16 tolerance 1e-2.
// Tunables: BLOCK_M (maps per block, multiple of 16), BLOCK_N (pixels per block, multiple of 16),
// WARPS (warps per block). The reduction chunk kBlockK = 32 is fixed: two m16n16k16 steps per
// barrier pair (R = 49 pads to 64 with 16 or 32; R = 196 to 224 instead of 208).
#include <mma.h>

#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 16
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef WARPS
#define WARPS 4
#endif

using namespace nvcuda;

constexpr int kFragM = 16, kFragN = 16, kFragK = 16;  // the WMMA shape
constexpr int kBlockK = 32;
constexpr int kThreads = WARPS * 32;
constexpr int kWarpsN = WARPS < BLOCK_N / kFragN ? WARPS : BLOCK_N / kFragN;
constexpr int kWarpsM = WARPS / kWarpsN;
constexpr int kWarpFragsM = BLOCK_M / kFragM / kWarpsM;  // fragments per warp
constexpr int kWarpFragsN = BLOCK_N / kFragN / kWarpsN;
// Leading dimensions (elements). +8 halves = 16 bytes: the 8 rows a fragment load reads at once
// fall on distinct banks, and every fragment start stays 32-byte aligned as WMMA requires.
constexpr int kLdA = kBlockK + 8, kLdB = BLOCK_N + 8;
constexpr int kLdC = kFragN + 4;  // float scratch: a multiple of 4 floats
// The input tile loader: kColThreads threads across a row, each with kCols columns (kColThreads
// apart, so a warp's loads are consecutive pixels), kLoadRows rows per pass.
constexpr int kColThreads = kThreads < BLOCK_N ? kThreads : BLOCK_N;
constexpr int kCols = BLOCK_N / kColThreads;
constexpr int kRowsPerPass = kThreads / kColThreads;
constexpr int kLoadRows = kRowsPerPass < kBlockK ? kRowsPerPass : kBlockK;
constexpr int kAPerThread = BLOCK_M * kBlockK / kThreads;
// Shared memory: the two half tiles during the loop, then per-warp float scratch over them.
constexpr int kABytes = BLOCK_M * kLdA * 2;
constexpr int kBBytes = kBlockK * kLdB * 2;
constexpr int kScratchFloats = kFragM * kLdC;
constexpr int kTileBytes = kABytes + kBBytes;
constexpr int kScratchBytes = WARPS * kScratchFloats * 4;
constexpr int kSmemBytes = kTileBytes > kScratchBytes ? kTileBytes : kScratchBytes;

static_assert(BLOCK_M % kFragM == 0 && BLOCK_N % kFragN == 0, "the block tile must be whole fragments");
static_assert(WARPS % kWarpsN == 0 && (BLOCK_M / kFragM) % kWarpsM == 0, "warps must divide the fragments");
static_assert(kThreads <= 1024, "at most 32 warps");
static_assert(BLOCK_N % kColThreads == 0 && kThreads % kColThreads == 0, "loader threads must divide BLOCK_N");
static_assert(kBlockK % kLoadRows == 0 && kBlockK % kFragK == 0, "loader rows and fragments must divide kBlockK");
static_assert((BLOCK_M * kBlockK) % kThreads == 0, "the weight tile must split evenly over the threads");
static_assert(kABytes % 32 == 0 && (kScratchFloats * 4) % 32 == 0, "WMMA pointers must be 32-byte aligned");
static_assert(kSmemBytes <= 48 * 1024, "static shared memory is limited to 48 KB");

extern "C" __global__ void __launch_bounds__(kThreads) conv_forward(CONV_ARGS) {
    __shared__ __align__(32) unsigned char smem[kSmemBytes];
    __half (*a_tile)[kLdA] = reinterpret_cast<__half (*)[kLdA]>(smem);            // [BLOCK_M][kLdA]
    __half (*b_tile)[kLdB] = reinterpret_cast<__half (*)[kLdB]>(smem + kABytes);  // [kBlockK][kLdB]

    const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
    const int HW_out = H_out * W_out;
    const int N = B * HW_out;
    const int R = C * K * K;
    const int m0 = blockIdx.y * BLOCK_M, n0 = blockIdx.x * BLOCK_N;
    const int tid = threadIdx.x;

    // Input loader: window origins of this thread's tile columns, decomposed once.
    const int lx = tid % kColThreads, ly = tid / kColThreads;
    const float *x_col[kCols];
    bool col_ok[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
        const int n = n0 + lx + j * kColThreads;
        col_ok[j] = n < N;
        const int b = col_ok[j] ? n / HW_out : 0;
        const int hw = col_ok[j] ? n - b * HW_out : 0;
        const int h = hw / W_out, w = hw - h * W_out;
        x_col[j] = x + image_offset(b, C, H, W) + (h * S) * W + w * S;
    }
    RowCursor row(ly, kLoadRows, K, H, W);
    const bool loads_x = ly < kLoadRows;

    const int warp = tid / 32, lane = tid % 32;
    const int wm = warp / kWarpsN, wn = warp % kWarpsN;
    wmma::fragment<wmma::accumulator, kFragM, kFragN, kFragK, float> acc[kWarpFragsM][kWarpFragsN];
#pragma unroll
    for (int i = 0; i < kWarpFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kWarpFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    for (int r0 = 0; r0 < R; r0 += kBlockK) {
        // Weights: consecutive threads read consecutive r of one map row (coalesced). They are
        // BLOCK_M / BLOCK_N of the staged elements and L2-resident, so scalar loads do.
#pragma unroll
        for (int u = 0; u < kAPerThread; ++u) {
            const int e = tid + u * kThreads;
            const int mm = e / kBlockK, kk = e % kBlockK;
            const int m = m0 + mm, r = r0 + kk;
            a_tile[mm][kk] = __float2half(m < M && r < R ? k[m * R + r] : 0.f);
        }
        if (loads_x) {
#pragma unroll
            for (int pass = 0; pass < kBlockK / kLoadRows; ++pass) {
                const bool row_ok = row.r < R;
#pragma unroll
                for (int j = 0; j < kCols; ++j)
                    b_tile[ly + pass * kLoadRows][lx + j * kColThreads] =
                        __float2half(row_ok && col_ok[j] ? x_col[j][row.off] : 0.f);
                row.advance(kLoadRows, K, H, W);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBlockK; kk += kFragK) {
            wmma::fragment<wmma::matrix_a, kFragM, kFragN, kFragK, __half, wmma::row_major> a[kWarpFragsM];
#pragma unroll
            for (int i = 0; i < kWarpFragsM; ++i)
                wmma::load_matrix_sync(a[i], &a_tile[(wm * kWarpFragsM + i) * kFragM][kk], kLdA);
#pragma unroll
            for (int j = 0; j < kWarpFragsN; ++j) {
                wmma::fragment<wmma::matrix_b, kFragM, kFragN, kFragK, __half, wmma::row_major> v;
                wmma::load_matrix_sync(v, &b_tile[kk][(wn * kWarpFragsN + j) * kFragN], kLdB);
#pragma unroll
                for (int i = 0; i < kWarpFragsM; ++i) wmma::mma_sync(acc[i][j], a[i], v, acc[i][j]);
            }
        }
        __syncthreads();  // also: every warp is done with the tiles before the scratch reuses them
    }

    // Epilogue, per warp and fragment: lane owns column lane % 16 and rows lane / 16 + 2t, so a
    // store covers 16 consecutive pixels of two maps.
    float *scratch = reinterpret_cast<float *>(smem) + warp * kScratchFloats;  // [kFragM][kLdC]
    const int col = lane % kFragN;
#pragma unroll
    for (int j = 0; j < kWarpFragsN; ++j) {
        const int n = n0 + (wn * kWarpFragsN + j) * kFragN + col;
        const bool n_ok = n < N;
        const int b = n_ok ? n / HW_out : 0;
        const int hw = n_ok ? n - b * HW_out : 0;
        float *y_col = y + image_offset(b, M, H_out, W_out) + hw;
#pragma unroll
        for (int i = 0; i < kWarpFragsM; ++i) {
            const int m_frag = m0 + (wm * kWarpFragsM + i) * kFragM;
            if (m_frag >= M) continue;  // warp-uniform: a fragment of padding maps only
            wmma::store_matrix_sync(scratch, acc[i][j], kLdC, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int t = lane / kFragN; t < kFragM; t += 32 / kFragN) {
                const int m = m_frag + t;
                if (n_ok && m < M) y_col[m * HW_out] = scratch[t * kLdC + col] + bias[m];
            }
            __syncwarp();  // reads done before the next fragment overwrites the scratch
        }
    }
}
