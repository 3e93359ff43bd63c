// kernels_neon.cpp built a second time for CPUs with the dot-product extension (sdot): the only file
// compiled with -march=armv8.2-a+dotprod. It defines kernels_neon_dotprod(); kernels_neon() picks it
// when cpu_features().dotprod. (llamafile's per-ISA stubs: one source, one object per ISA.)
#define CLOVER_NEON_DOTPROD 1
#include "kernels_neon.cpp"
