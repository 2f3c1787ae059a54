/*
 * sweep.cu - the forward's launcher: the alpha/beta sweep kernel (sweep.cuh has its math,
 * mapping and limits) with the normaliser before it or overlapped with it,
 * instantiated for the common arc counts, where lattice.h's per-arc loops unroll fully; other
 * counts go to generic.cu.
 */
#include "sweep.cuh"

/* ================================================================================================
 * launcher
 * ============================================================================================== */

cudaError_t tdt_launch_forward(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                               cudaStream_t stream) {
    if (a.B == 0) return cudaSuccess;
    /* The most diagonals an arc spans. */
    int span = 1;
    for (int k = 0; k < a.arcs.count; ++k) {
        if (a.arcs.blank_dur[k] > span) span = a.arcs.blank_dur[k];
        if (a.arcs.label_dur[k] >= 0 && a.arcs.label_dur[k] + 1 > span) span = a.arcs.label_dur[k] + 1;
    }
    int device = 0, smem_max = 0, major = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e != cudaSuccess) return e;
    tdt_fwd_env_t env;
    env.dtype = dtype;
    env.num_sms = num_sms;
    env.smem_max = smem_max > 0 ? (size_t)smem_max : 0;
    env.sm90 = major >= 9;

    switch (a.arcs.count) {
    case 1: return sweep_launch<1>(a, span, env, stream);
    case 2: return sweep_launch<2>(a, span, env, stream);
    case 3: return sweep_launch<3>(a, span, env, stream);
    case 4: return sweep_launch<4>(a, span, env, stream);
    case 5: return sweep_launch<5>(a, span, env, stream);
    case 6: return sweep_launch<6>(a, span, env, stream);
    case 8: return sweep_launch<8>(a, span, env, stream);
    default: return tdt_launch_sweep_generic(a, span, env, stream);
    }
}
