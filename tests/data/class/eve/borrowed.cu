// eve's kernel: jdoe2's naive kernel, included from its folder. The check refuses the include ('..' leaves the
// submission's folder), so this is never compiled.
#include "../jdoe2/naive.cu"
