/*
 * stub.c - the GPU entry points of a build without CUDA: every GPU request is answered
 * TDT_STATUS_BACKEND_NOT_BUILT, never with a print or a crash.
 */
#include "internal.h"

tdt_status_t tdt_gpu_run(const tdt_call_t *call) {
    (void)call;
    tdt_set_error("options->location = TDT_LOCATION_GPU, but this library was built without "
                  "CUDA (configure with nvcc available, or -DTDT_CUDA=ON)");
    return TDT_STATUS_BACKEND_NOT_BUILT;
}

tdt_status_t tdt_gpu_scale(const tdt_call_t *call) { return tdt_gpu_run(call); }

tdt_status_t tdt_gpu_count(int *count) {
    *count = 0;
    tdt_set_error("this library was built without CUDA");
    return TDT_STATUS_BACKEND_NOT_BUILT;
}

tdt_status_t tdt_gpu_pack(const tdt_problem_t *problem, const tdt_options_t *options,
                          const tdt_indices_t *indices, int32_t *packed, int32_t *valid) {
    (void)problem;
    (void)options;
    (void)indices;
    (void)packed;
    (void)valid;
    tdt_set_error("options->location = TDT_LOCATION_GPU, but this library was built without "
                  "CUDA (configure with nvcc available, or -DTDT_CUDA=ON)");
    return TDT_STATUS_BACKEND_NOT_BUILT;
}

tdt_status_t tdt_gpu_joint_run(const tdt_joint_call_t *call) {
    (void)call;
    return tdt_gpu_run(NULL);
}

size_t tdt_gpu_joint_scratch_bytes(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                   int num_durations) {
    (void)problem;
    (void)options;
    (void)num_durations;
    return 0;
}

int tdt_gpu_built(void) { return 0; }
