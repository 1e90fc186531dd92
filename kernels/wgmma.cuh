// wgmma.cuh: Hopper's warpgroup MMA (wgmma.mma_async m64nNk16 .f32.f16.f16, sm_90a) as wgmma_conv2.cu and
// wgmma_fused_network.cu issue it: A from registers, B from shared memory through a matrix descriptor; the
// fence / commit / wait around it, the register pins ptxas needs, and the shared-memory addressing the
// kernels use with it. PTX ISA, "Asynchronous Warpgroup Level Matrix ...".
// B (shared memory, K-major, no swizzle, imm-trans-b 0): core matrices of 8 n-rows x 16 bytes (8 k's of one
// n), 128 contiguous bytes, LBO apart along K and SBO apart along N (b_offset below): a k16 x n16 tile is
// 512 bytes, a k16 x n32 block 1024. Each kernel's top comment says how its weights fill them.
#pragma once

constexpr unsigned LBO = 128, SBO = 256;  // core-matrix strides along K and along N

// Byte offset of B[k][n] from its tile's (or block's) start.
__device__ __forceinline__ int b_offset(int k, int n) {
    return (k / 8) * LBO + (n / 8) * SBO + (n % 8) * 16 + (k % 8) * 2;
}

// The shared-memory matrix descriptor of a B run starting at shared address `addr` (no swizzle, base offset 0):
// [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [49,52) base offset, [62,64) swizzle.
__device__ __forceinline__ unsigned long long b_desc(unsigned addr) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (static_cast<unsigned long long>(LBO >> 4) << 16) |
           (static_cast<unsigned long long>(SBO >> 4) << 32);
}

// A descriptor as two words: the low one (address >> 4, LBO >> 4) varies with the tile, the high one (SBO >> 4)
// does not; desc_lo(addr + 1024 j) == desc_lo(addr) + 64 j while the tiles stay in one 256 KB window.
__device__ __forceinline__ unsigned desc_lo(unsigned addr) { return ((addr & 0x3FFFF) >> 4) | ((LBO >> 4) << 16); }
__device__ __forceinline__ unsigned long long desc_of(unsigned lo) {
    return static_cast<unsigned long long>(lo) | (static_cast<unsigned long long>(SBO >> 4) << 32);
}

// *p = v where `pred`, as one predicated st.shared (no branch around it).
__device__ __forceinline__ void st_shared_u16_if(unsigned short *p, unsigned short v, bool pred) {
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q st.shared.u16 [%0], %1;\n}\n" ::"r"(smem_u32(p)), "h"(v),
                 "r"(static_cast<int>(pred))
                 : "memory");
}

// 32 bits at shared address `addr` / 16 bits to it (a constant added to addr folds into the instruction's
// immediate: base register + offset addressing).
__device__ __forceinline__ unsigned lds32_at(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void sts16_at(unsigned addr, unsigned short v) {
    asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

// `v` as a value the compiler cannot recompute from its inputs: computed once where this is called (before
// a loop), held in a register, not rebuilt (sunk) at each use inside the loop.
__device__ __forceinline__ unsigned long long held(unsigned long long v) {
    asm volatile("mov.b64 %0, %0;" : "+l"(v));
    return v;
}
__device__ __forceinline__ unsigned held(unsigned v) {
    asm volatile("mov.b32 %0, %0;" : "+r"(v));
    return v;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

// Pins a register's value at this point of the program (CUTLASS's warpgroup_fence_operand): the compiler
// must not move its computation past, nor its use before, the wgmma.fence / wait_group around it.
__device__ __forceinline__ void pin(float &v) { asm volatile("" : "+f"(v)::"memory"); }
__device__ __forceinline__ void pin(unsigned &v) { asm volatile("" : "+r"(v)::"memory"); }

// D[64 x N] += A[64 x 16] (registers) * B[16 x N] (shared memory, descriptor), fp32 accumulate; the
// accumulators as N / 16 runs of 8 registers (columns 16 i .. 16 i + 15 in d_i).
#define D8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WGMMA_TAIL : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACCUMULATE)
typedef float Acc8[8];

// ACCUMULATE 0 (scale-d false): D = A * B, the accumulators' old values unread (no zeroing before).
template <int ACCUMULATE = 1>
__device__ __forceinline__ void wgmma_n16(Acc8 &d0, const unsigned (&a)[4], unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : D8(d0) WGMMA_TAIL);
}

template <int ACCUMULATE = 1>
__device__ __forceinline__ void wgmma_n32(Acc8 &d0, Acc8 &d1, const unsigned (&a)[4], unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : D8(d0), D8(d1) WGMMA_TAIL);
}

#undef D8
#undef WGMMA_TAIL
