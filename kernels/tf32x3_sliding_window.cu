// tf32x3_sliding_window: tf32_sliding_window.cu with 3xTF32 (SPLIT 3, sliding_window.cuh): x and
// k are each split into a tf32 "big" part and a tf32 "small" remainder, and three mmas
// (small*big + big*small + big*big) recover fp32-class error (1e-5) on tensor cores at three
// times the tensor work. Measured (bench, H100, B=10000): conv1 0.823 ms, conv2 1.053 ms, errors
// 4.9e-7 and 2.0e-6.
// Tunables (registry): WARPS, PR, STAGED (1, 2), MAP_SPLIT; SPLIT is 3 here.
#include "sliding_window.cuh"
