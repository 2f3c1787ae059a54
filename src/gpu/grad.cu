/*
 * grad.cu - the gradient kernel (grad.cuh has its math, mapping and limits), instantiated for
 * the common arc counts, where lattice.h's per-arc loops unroll fully and the node's
 * coefficients stay in registers; other counts go to generic.cu.
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
struct ordered_arcs {
    const tdt_gpu_args_t &a;
    tdt_dtype_t dtype;
    int blocks;
    cudaStream_t stream;
    template <int KD> cudaError_t go() const {
        return tdt_with_dtype(dtype, a.V, grad_in_order<KD>{a, blocks, stream});
    }
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
    bool done;
    const cudaError_t e = tdt_with_arcs(a.arcs.count, ordered_arcs{a, dtype, blocks, stream}, &done);
    return done ? e : cudaErrorInvalidValue;
}
