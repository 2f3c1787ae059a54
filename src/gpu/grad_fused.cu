/*
 * grad_fused.cu - the fused schedule's gradient kernel (grad.cuh, grad_ordered_kernel with
 * FUSED; sweep.cuh, "The fused schedule"), for the arc counts with their own instantiation.
 * A translation unit of its own: its kernels compile beside grad.cu's.
 */
#include "grad.cuh"

cudaError_t tdt_launch_grad_fused(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                  cudaStream_t stream) {
    return grad_ordered_launch<GS_FUSED>(a, dtype, blocks, stream);
}
