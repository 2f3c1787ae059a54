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

/* f.template go<KD>() for the arc counts instantiated here; 0 for the others (generic.cu). */
template <typename F> cudaError_t with_arcs(int count, F f, bool *done) {
    *done = true;
    switch (count) {
    case 1: return f.template go<1>();
    case 2: return f.template go<2>();
    case 3: return f.template go<3>();
    case 4: return f.template go<4>();
    case 5: return f.template go<5>();
    case 6: return f.template go<6>();
    case 8: return f.template go<8>();
    default: *done = false; return cudaSuccess;
    }
}

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
        return grad_with_dt(dtype, a.V, grad_in_order<KD>{a, blocks, stream});
    }
};
struct no_arcs {
    template <int KD> cudaError_t go() const { return cudaSuccess; }
};

} /* namespace */

cudaError_t tdt_launch_grad(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                            cudaStream_t stream) {
    if (a.nodes == 0 || (!a.tok_g && !(a.dur_g && a.D > 0))) return cudaSuccess;
    bool done;
    const cudaError_t e = with_arcs(a.arcs.count, plain_arcs{a, dtype, num_sms, stream}, &done);
    return done ? e : tdt_launch_grad_generic(a, dtype, num_sms, stream);
}

int tdt_grad_ordered_arcs(int count) {
    bool done;
    (void)with_arcs(count, no_arcs{}, &done);
    return done;
}

cudaError_t tdt_launch_grad_ordered(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                    cudaStream_t stream) {
    bool done;
    const cudaError_t e = with_arcs(a.arcs.count, ordered_arcs{a, dtype, blocks, stream}, &done);
    return done ? e : cudaErrorInvalidValue;
}

int tdt_grad_ticket_nodes(int64_t V, tdt_dtype_t dtype) {
    int n = 1;
    (void)grad_with_dt(dtype, V, grad_ticket{&n});
    return n;
}
