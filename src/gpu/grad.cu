/*
 * grad.cu - the gradient kernel (grad.cuh has its math, mapping and limits), instantiated for
 * the common arc counts, where lattice.h's per-arc loops unroll fully and the node's
 * coefficients stay in registers; other counts go to generic.cu. The split schedule's ordered
 * kernel is here too, the fused schedule's in grad_fused.cu, the trail schedule's in
 * grad_trail.cu.
 */
#include "grad.cuh"

/* ================================================================================================
 * launcher
 * ============================================================================================== */

namespace {

struct plain_arcs {
    const tdt_gpu_args_t &a;
    tdt_dtype_t dtype;
    int num_sms;
    cudaStream_t stream;
    template <int KD> cudaError_t go() const { return grad_launch<KD>(a, dtype, num_sms, stream); }
};

} /* namespace */

cudaError_t tdt_launch_grad(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                            cudaStream_t stream) {
    bool done;
    const cudaError_t e = tdt_with_arcs(a.arcs.count, plain_arcs{a, dtype, num_sms, stream}, &done);
    return done ? e : tdt_launch_grad_generic(a, dtype, num_sms, stream);
}

cudaError_t tdt_launch_grad_ordered(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                    cudaStream_t stream) {
    return grad_ordered_launch<GS_PLAIN>(a, dtype, blocks, stream);
}
