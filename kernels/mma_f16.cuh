// mma_f16.cuh: the fp16 tensor-core and conversion helpers shared by the sliding-window kernels
// (sliding_window.cuh) and the fused network (fp16_fused_network.cu). mma.sync fragments as in the
// PTX ISA (g = lane / 4, t = lane % 4), f16x2 operands, fp32 accumulate.
#pragma once

// float -> fp16 bits, round to nearest even.
__device__ __forceinline__ unsigned short to_half(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

// Two floats -> one f16x2 word: `lo` in the low half (the lower address, the smaller k).
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
    return r;
}

// m16n8k8: A = {a0: (g, 2t..2t+1), a1: (g+8, 2t..2t+1)}, B = {b0: (k 2t..2t+1, n g)}.
__device__ __forceinline__ void mma_f16(float (&d)[4], unsigned a0, unsigned a1, unsigned b0) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// m16n8k16: A = {a0, a1} as m16n8k8's for k 0-7, {a2, a3} the same for k 8-15; B = {b0: (k 2t..2t+1,
// n g), b1: (k 2t+8..2t+9, n g)}; D: d0, d1 (g, 2t + 0/1), d2, d3 (g+8, 2t + 0/1).
__device__ __forceinline__ void mma_f16_k16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// max that keeps a NaN (like layers.cu's maxpool), in one instruction (sm_80+): the epilogue's
// maxes were 3-4 integer/compare ops each, on kernels whose busiest pipe is the ALU.
__device__ __forceinline__ float max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
