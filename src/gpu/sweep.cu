/*
 * sweep.cu - the launchers of the forward (the alpha/beta sweep kernel, sweep.cuh, with the
 * normaliser before it or overlapped with it) and of the backward (the gradient pass, with the
 * split schedule's beta sweep before it), instantiated for the common arc counts, where
 * lattice.h's per-arc loops unroll fully; other counts go to generic.cu.
 */
#include "sweep.cuh"

namespace {

/* The most diagonals an arc spans (lattice.h), as the launchers' int. */
int arc_span(const tdt_arcs_t &arcs) {
    const int64_t span = tdt_arcs_span(&arcs);
    return span > INT_MAX ? INT_MAX : (int)span;
}

cudaError_t env_of(tdt_dtype_t dtype, int num_sms, tdt_gpu_schedule_t schedule, tdt_fwd_env_t *env) {
    int device = 0, smem_max = 0, major = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    e = tdt_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device, &smem_max);
    if (e != cudaSuccess) return e;
    e = tdt_device_attribute(cudaDevAttrComputeCapabilityMajor, device, &major);
    if (e != cudaSuccess) return e;
    env->dtype = dtype;
    env->num_sms = num_sms;
    env->smem_max = smem_max > 0 ? (size_t)smem_max : 0;
    env->sm90 = major >= 9;
    env->schedule = schedule;
    env->device = device;
    env->prologue = NULL;
    return cudaSuccess;
}

/* The forward's (sweep_launch) or the backward's (backward_launch) launches for arc count KD. */
template <bool BACKWARD> struct launch_arcs {
    const tdt_gpu_args_t &a;
    int span;
    const tdt_fwd_env_t &env;
    cudaStream_t stream;
    bool *bwd_done;
    template <int KD> cudaError_t go() const {
        return BACKWARD ? backward_launch<KD>(a, span, env, stream)
                        : sweep_launch<KD>(a, span, env, stream, bwd_done);
    }
};

} /* namespace */

/* ================================================================================================
 * launchers
 * ============================================================================================== */

cudaError_t tdt_launch_forward(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                               tdt_gpu_schedule_t schedule, cudaStream_t stream, bool *bwd_done,
                               const tdt_gpu_prologue_t *prologue) {
    if (bwd_done) *bwd_done = false;
    if (a.B == 0) return cudaSuccess;
    const int span = arc_span(a.arcs);
    tdt_fwd_env_t env;
    const cudaError_t e = env_of(dtype, num_sms, schedule, &env);
    if (e != cudaSuccess) return e;
    env.prologue = prologue;
    bool done;
    const cudaError_t e2 =
        tdt_with_arcs(a.arcs.count, launch_arcs<false>{a, span, env, stream, bwd_done}, &done);
    return done ? e2 : tdt_launch_sweep_generic(a, span, env, stream);
}

cudaError_t tdt_launch_backward(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                tdt_gpu_schedule_t schedule, cudaStream_t stream) {
    if (a.B == 0 || a.nodes == 0 || (!a.tok_g && !(a.dur_g && a.D > 0))) return cudaSuccess;
    const int span = arc_span(a.arcs);
    tdt_fwd_env_t env;
    const cudaError_t e = env_of(dtype, num_sms, schedule, &env);
    if (e != cudaSuccess) return e;
    bool done; /* the counts with an ordered gradient kernel; the others never split */
    const cudaError_t e2 = tdt_with_arcs(a.arcs.count, launch_arcs<true>{a, span, env, stream, NULL}, &done);
    return done ? e2 : tdt_launch_grad(a, dtype, num_sms, stream);
}
