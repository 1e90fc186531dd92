// What a grid-stride CUDA kernel needs to compile as plain C++ on the host (tests/host_kernels.py): the
// thread and block indices as globals the launcher sets, empty qualifiers, and half as GCC's _Float16
// (round to nearest even, as __float2half_rn). Only kernels without shared memory or synchronization
// (kernels/truth.cu) run correctly this way: the launcher runs one thread after another.
#pragma once
#include <math.h>

#define __device__
#define __forceinline__ inline
struct HostDim3 {
    unsigned x, y, z;
};
extern HostDim3 threadIdx, blockIdx, blockDim, gridDim;
typedef _Float16 __half;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return (__half)f; }
