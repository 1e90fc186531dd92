// The kernel ABI and shared index helpers for every variant. Tensors are NCHW and contiguous.
// Shapes arrive as kernel arguments (B, C, M, H, W, K, S); H and W are the input sizes, the
// output is H_out = (H - K) / S + 1 (valid convolution).
//
// Every entry point takes CONV_ARGS, then, in this order, only what its registry entry declares:
//   WORKSPACE_ARG  a device buffer of the registry's `workspace` bytes (im2col columns, half
//                  copies, spectra), private to the stream the launch runs on;
//   PREPARED_ARG   the weights in the variant's own form (registry `prepare`: its bytes and the
//                  launches that write it, once, when the runner binds the weights; they get
//                  the same arguments with y and x null), read-only to every other launch;
//   POOL_ARGS      the fused max-pool window P and stride PS (variants whose `fuses` lists
//                  maxpool; y is then the pooled output, [B][M][H_pool][W_pool]);
//   FUSED_WEIGHTS  one per later layer with weights that the variant computes too (a variant
//                  whose `fuses` runs on past its pool, to the network's end: y is then the
//                  logits), in layer order: that layer's weight and bias.
#pragma once

// The element type of x, k, bias and y: float, or double when the network is float64 (the
// runner defines CONV_T=double for variants whose registry `dtypes` list float64).
#ifndef CONV_T
#define CONV_T float
#endif
typedef CONV_T conv_t;

#define CONV_ARGS                                                                          \
    conv_t *__restrict__ y, const conv_t *__restrict__ x, const conv_t *__restrict__ k,     \
        const conv_t *__restrict__ bias, int B, int C, int M, int H, int W, int K, int S
#define WORKSPACE_ARG void *__restrict__ workspace
#define PREPARED_ARG void *__restrict__ prepared
#define POOL_ARGS int P, int PS
#define FUSED_WEIGHTS(layer) const conv_t *__restrict__ layer##_w, const conv_t *__restrict__ layer##_b

__device__ __forceinline__ int conv_out_size(int in, int k, int s) { return (in - k) / s + 1; }

// The 32-bit shared-memory address of a generic pointer to shared memory (what wgmma descriptors, bulk copies,
// mbarriers and ld/st.shared take).
__device__ __forceinline__ unsigned smem_u32(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Start of image b in a [B][C][H][W] tensor. 64-bit because B*C*H*W passes 2^31 at large
// batches; indices inside one image stay 32-bit, which is cheaper in the inner loops.
__device__ __forceinline__ long long image_offset(int b, int C, int H, int W) {
    return (long long)b * C * H * W;
}

// Implicit-GEMM helper (fused_gemm, register_tiled_gemm): rows r = (c, p, q) of the unrolled
// input matrix, as offsets from a window origin.
// It walks rows r of the unrolled matrix by a fixed step, keeping off = c*H*W + p*W + q (the row's
// offset from a window origin) without a division per step.
struct RowCursor {
    int r, p, q, off;
    int dp, dq, d_off;

    __device__ RowCursor(int r0, int step, int K, int H, int W) : r(r0) {
        q = r0 % K;
        p = (r0 / K) % K;
        off = (r0 / (K * K)) * H * W + p * W + q;
        dq = step % K;
        dp = (step / K) % K;
        d_off = (step / (K * K)) * H * W + dp * W + dq;
    }
    __device__ void advance(int step, int K, int H, int W) {
        r += step;
        q += dq;
        p += dp;
        off += d_off;
        if (q >= K) { q -= K; ++p; off += W - K; }
        if (p >= K) { p -= K; off += (H - K) * W; }
    }
};
