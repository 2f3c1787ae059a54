/*
 * generic.cu - the sweep and gradient kernels for arc counts without their own instantiation
 * (TDT with 7 or more than 8 durations): the same kernels (sweep.cuh, grad.cuh) with the arc
 * count a runtime value. TDT_ARCS_NO_UNROLL keeps lattice.h's per-arc loops as plain loops in
 * this file, since unrolling them to TDT_MAX_DURATIONS guarded copies would only cost compile
 * time and registers when the count is not a compile-time constant.
 */
#define TDT_ARCS_NO_UNROLL 1

#include "grad.cuh"
#include "sweep.cuh"

cudaError_t tdt_launch_sweep_generic(const tdt_gpu_args_t &a, int span, const tdt_fwd_env_t &env,
                                     cudaStream_t stream) {
    return sweep_launch<0>(a, span, env, stream, NULL); /* never fused: no ordered gradient kernel */
}

cudaError_t tdt_launch_grad_generic(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                    cudaStream_t stream) {
    return grad_launch<0>(a, dtype, num_sms, stream);
}
