// The tensor-core implicit GEMM shared by wmma_16x16x16.cu and wmma_8x32x16.cu; each of those
// files picks the fragment shape and the gather mapping (WmmaConv's parameters) and is otherwise
// this kernel.
// The GEMM of register_tiled_gemm (Y[m, n] = sum_r Kmat[m, r] * X[r, n], r = (c, p, q) over
// R = C*K*K, n = (b, h, w) over N = B*H_out*W_out, batch in N) on the tensor cores through WMMA:
// fp16 operands, fp32 accumulators. Each block stages, per kBlockK-deep chunk of r, the
// BLOCK_M x kBlockK weight tile and the kBlockK x BLOCK_N gathered input tile (implicit_gemm.cuh)
// in shared memory as half (converted from float while loading; rows past R, maps past M and
// pixels past N are zeros), then every warp multiplies its fragments with wmma::mma_sync. At the
// end a warp stores each accumulator fragment to its own float scratch in shared memory
// (aliasing the tiles; the layout of a fragment's registers is unspecified, so it must pass
// through store_matrix_sync), adds the bias and writes y (NCHW; only valid maps and pixels).
// Mapping: grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M)), block WARPS * 32 threads; the warps are
// spread over N first (kWarpsN = min(WARPS, BLOCK_N / kFragN)), then M, and each warp owns a
// kWarpFragsM x kWarpFragsN block of kFragM x kFragN output fragments.
// Single-buffered: the gather's latency is hidden by other resident blocks, which the small
// shared footprint leaves room for, not by prefetching.
// The reduction chunk kBlockK = 32 is fixed: two k16 steps per barrier pair (R = 49 pads to 64
// with 16 or 32; R = 196 to 224 instead of 208).
// The whole kernel is one function (run), not a set of helpers: its arrays (columns, fragments)
// and the loops over them must stay in one function for the machine code to stay what it was
// when each file had its own copy (implicit_gemm.cuh says why).
#pragma once

#include <mma.h>

#include "implicit_gemm.cuh"

// kEveryRow: every thread loads every row of a chunk, kCols = BLOCK_N / kThreads columns each
// (needs BLOCK_N to be a multiple of the block's threads); otherwise the rows of a chunk are
// split over groups of kColThreads threads as GatherShape describes.
template <int kFragM, int kFragN, int kFragK, int kBlockM, int kBlockN, int kWarps, bool kEveryRow>
struct WmmaConv {
    static constexpr int kBlockK = 32;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kWarpsN = kWarps < kBlockN / kFragN ? kWarps : kBlockN / kFragN;
    static constexpr int kWarpsM = kWarps / kWarpsN;
    static constexpr int kWarpFragsM = kBlockM / kFragM / kWarpsM;  // fragments per warp
    static constexpr int kWarpFragsN = kBlockN / kFragN / kWarpsN;
    // Leading dimensions (elements). +8 halves = 16 bytes: the 8 rows a fragment load reads at
    // once fall on distinct banks, and every fragment start stays 32-byte aligned as WMMA requires.
    static constexpr int kLdA = kBlockK + 8, kLdB = kBlockN + 8;
    static constexpr int kLdC = kFragN + 4;  // float scratch: a multiple of 4 floats
    using Gather = GatherShape<kThreads, kBlockN, kBlockK>;
    static constexpr int kColThreads = Gather::kColThreads, kCols = Gather::kCols, kLoadRows = Gather::kLoadRows;
    static constexpr int kAPerThread = kBlockM * kBlockK / kThreads;
    // Shared memory: the two half tiles during the loop, then per-warp float scratch over them.
    static constexpr int kABytes = kBlockM * kLdA * 2;
    static constexpr int kBBytes = kBlockK * kLdB * 2;
    static constexpr int kScratchFloats = kFragM * kLdC;
    static constexpr int kTileBytes = kABytes + kBBytes;
    static constexpr int kScratchBytes = kWarps * kScratchFloats * 4;
    static constexpr int kSmemBytes = kTileBytes > kScratchBytes ? kTileBytes : kScratchBytes;

    static_assert(kBlockM % kFragM == 0 && kBlockN % kFragN == 0, "the block tile must be whole fragments");
    static_assert(kWarps % kWarpsN == 0 && (kBlockM / kFragM) % kWarpsM == 0, "warps must divide the fragments");
    static_assert(kThreads <= 1024, "at most 32 warps");
    static_assert(!kEveryRow || kBlockN % kThreads == 0, "each thread loads whole columns of the input tile");
    static_assert(kBlockK % kFragK == 0, "fragments must divide kBlockK");
    static_assert((kBlockM * kBlockK) % kThreads == 0, "the weight tile must split evenly over the threads");
    static_assert(kABytes % 32 == 0 && (kScratchFloats * 4) % 32 == 0, "WMMA pointers must be 32-byte aligned");
    static_assert(kSmemBytes <= 48 * 1024, "static shared memory is limited to 48 KB");

    static __device__ __forceinline__ void run(CONV_ARGS) {
        using namespace nvcuda;
        __shared__ __align__(32) unsigned char smem[kSmemBytes];
        __half (*a_tile)[kLdA] = reinterpret_cast<__half (*)[kLdA]>(smem);            // [BLOCK_M][kLdA]
        __half (*b_tile)[kLdB] = reinterpret_cast<__half (*)[kLdB]>(smem + kABytes);  // [kBlockK][kLdB]

        const int H_out = conv_out_size(H, K, S), W_out = conv_out_size(W, K, S);
        const int HW_out = H_out * W_out;
        const int N = B * HW_out;
        const int R = C * K * K;
        const int m0 = blockIdx.y * kBlockM, n0 = blockIdx.x * kBlockN;
        const int tid = threadIdx.x;

        // Input loader: window origins of this thread's tile columns, decomposed once.
        const int lx = kEveryRow ? tid : tid % kColThreads, ly = kEveryRow ? 0 : tid / kColThreads;
        const float *x_col[kCols];
        bool col_ok[kCols];
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
            const int n = n0 + lx + j * kColThreads;
            col_ok[j] = n < N;
            x_col[j] = column_origin(x, n, col_ok[j], HW_out, W_out, C, H, W, S);
        }
        RowCursor row(ly, kLoadRows, K, H, W);
        const bool loads_x = kEveryRow || ly < kLoadRows;

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

        // Epilogue, per warp and fragment: lane owns column lane % kFragN and rows lane / kFragN,
        // + 32 / kFragN, ..., so a store covers kFragN consecutive pixels of 32 / kFragN maps.
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
};
