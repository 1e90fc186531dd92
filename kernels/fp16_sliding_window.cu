// fp16_sliding_window: tf32_sliding_window.cu with the input rows staged in shared memory as fp16
// (plus a copy shifted by one element, so every fragment starts on a 32-bit word) and mma.sync
// .f16 with fp32 accumulate (HALF 1, sliding_window.cuh). A fragment is two 32-bit shared loads
// instead of four, and m16n8k16 takes two channels (even C) or two input rows (odd C, M 4, odd K)
// per mma: half the mmas for the same loads. Expected: fp16-class error (1e-2) and the fastest
// conv on both LeNet-86 layers; measured (bench, H100, B=10000) conv1 0.256 ms, conv2 0.308 ms.
// Tunables (registry): WARPS, PR, MAP_SPLIT, MIN_BLOCKS (a register cap); STAGED is 2 and HALF 1 here.
#include "sliding_window.cuh"
