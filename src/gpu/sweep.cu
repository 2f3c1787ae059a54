/*
 * sweep.cu - the alpha/beta sweep kernel (sweep.cuh has its math, mapping and limits),
 * instantiated for the common arc counts, where lattice.h's per-arc loops unroll fully; other
 * counts go to generic.cu.
 */
#include "sweep.cuh"

/* ================================================================================================
 * launcher
 * ============================================================================================== */

cudaError_t tdt_launch_sweep(const tdt_gpu_args_t &a, cudaStream_t stream) {
    if (a.B == 0) return cudaSuccess;
    /* One thread per node of the longest diagonal (at most min(maxT, maxU + 1) nodes), in
     * whole warps, capped: longer diagonals are strided. */
    int64_t diag = a.maxT < a.row ? a.maxT : a.row;
    int64_t threads = (diag + 31) / 32 * 32;
    if (threads < 32) threads = 32;
    if (threads > kMaxThreads) threads = kMaxThreads;
    const int th = (int)threads;
    switch (a.arcs.count) {
    case 1: return sweep_launch<1>(a, th, stream);
    case 2: return sweep_launch<2>(a, th, stream);
    case 3: return sweep_launch<3>(a, th, stream);
    case 4: return sweep_launch<4>(a, th, stream);
    case 5: return sweep_launch<5>(a, th, stream);
    case 6: return sweep_launch<6>(a, th, stream);
    case 8: return sweep_launch<8>(a, th, stream);
    default: return tdt_launch_sweep_generic(a, th, stream);
    }
}
