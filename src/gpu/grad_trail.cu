/*
 * grad_trail.cu - the trail schedule's gradient kernel (grad.cuh, grad_trail_kernel; sweep.cuh,
 * "The trail schedule"), for the arc counts with their own instantiation. A translation unit
 * of its own: its kernels compile beside grad.cu's and grad_fused.cu's.
 */
#include "grad.cuh"

cudaError_t tdt_launch_grad_trail(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                  cudaStream_t stream) {
    return grad_ordered_launch<GS_TRAIL>(a, dtype, blocks, stream);
}
