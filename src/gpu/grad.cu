/*
 * grad.cu - the gradient kernel (grad.cuh has its math, mapping and limits), instantiated for
 * the common arc counts, where lattice.h's per-arc loops unroll fully and the node's
 * coefficients stay in registers; other counts go to generic.cu.
 */
#include "grad.cuh"

/* ================================================================================================
 * launcher
 * ============================================================================================== */

cudaError_t tdt_launch_grad(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                            cudaStream_t stream) {
    if (a.nodes == 0 || (!a.tok_g && !(a.dur_g && a.D > 0))) return cudaSuccess;
    switch (a.arcs.count) {
    case 1: return grad_launch<1>(a, dtype, num_sms, stream);
    case 2: return grad_launch<2>(a, dtype, num_sms, stream);
    case 3: return grad_launch<3>(a, dtype, num_sms, stream);
    case 4: return grad_launch<4>(a, dtype, num_sms, stream);
    case 5: return grad_launch<5>(a, dtype, num_sms, stream);
    case 6: return grad_launch<6>(a, dtype, num_sms, stream);
    case 8: return grad_launch<8>(a, dtype, num_sms, stream);
    default: return tdt_launch_grad_generic(a, dtype, num_sms, stream);
    }
}
