// tf32_sliding_window: conv + bias + ReLU + max-pool on tensor cores (mma.sync m16n8k8 .tf32)
// with no im2col gather: for one input row the A operand is a sliding window of that row, ordered
// so each thread's fragment is four consecutive elements (sliding_window.cuh has the design, the
// fragment orders, the tunables and every measured version).
// This file's arithmetic: x and k rounded to tf32 once (cvt.rna), one mma per k8 step, fp32
// accumulate. Expected: tf32-class error (1e-3), the tensor-core rate on conv2 instead of the
// FMA pipe's; measured (bench, H100, B=10000) conv1 0.345 ms, conv2 0.448 ms.
// Tunables (registry): WARPS, PR, STAGED (0, 1, 2), MAP_SPLIT; SPLIT is 1 here.
#include "sliding_window.cuh"
