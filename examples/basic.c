/*
 * basic.c - a TDT loss and its gradients on the CPU, Parakeet-style: blank V - 1, durations
 * {0,1,2,3,4}, the token and duration logits two strided slices of one (B, T, U + 1, V + D)
 * joint tensor (made-up numbers here).
 * Build: cc -std=c99 basic.c -I include -L build -Wl,-rpath,"$PWD/build" -lwarptdt -lm
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tdt.h"

enum { B = 2, T = 6, U = 3, V = 8, D = 5 }; /* batch, frames, labels, vocabulary, durations */

int main(void) {
    static const int durations[D] = {0, 1, 2, 3, 4};
    const int32_t labels[B * U] = {1, 5, 2, /* sample 1: */ 3, 3, 0 /* padding */};
    const int32_t frame_lengths[B] = {6, 4};
    const int32_t label_lengths[B] = {3, 2};
    const size_t joint_elems = (size_t)B * T * (U + 1) * (V + D);
    float *joint = malloc(joint_elems * sizeof *joint);      /* the joint network's output */
    float *joint_grad = malloc(joint_elems * sizeof *joint_grad);
    float costs[B];
    size_t i, workspace_bytes = 0;
    void *workspace = NULL;
    tdt_status_t status;
    int b, k;

    if (!joint || !joint_grad) return 1;
    for (i = 0; i < joint_elems; ++i) joint[i] = (float)sin(0.37 * (double)i); /* stand-in logits */

    /* Options: unnamed fields are zero, the defaults (CPU, all OpenMP threads, raw logits...). */
    const tdt_options_t options = {.blank = V - 1, .durations = durations, .num_durations = D};

    /* The problem: token logits are joint[..., :V], duration logits joint[..., V:]. */
    const int64_t strides[3] = {(int64_t)T * (U + 1) * (V + D), (int64_t)(U + 1) * (V + D), V + D};
    tdt_problem_t problem = {.batch = B, .max_frames = T, .max_labels = U, .vocab_size = V,
                             .dtype = TDT_DTYPE_FLOAT32, .token_logits = joint, .duration_logits = joint + V,
                             .labels = labels, .frame_lengths = frame_lengths, .label_lengths = label_lengths};

    /* Gradients land in one joint-shaped buffer, laid out like the logits. */
    tdt_gradients_t grads = {.token_grads = joint_grad, .duration_grads = joint_grad + V};
    for (k = 0; k < 3; ++k)
        problem.token_strides[k] = problem.duration_strides[k] = grads.token_strides[k] =
            grads.duration_strides[k] = strides[k];

    /* Ask for the workspace size, allocate it, compute. */
    status = tdt_get_workspace_size(&problem, &options, &workspace_bytes);
    if (status == TDT_STATUS_SUCCESS) {
        workspace = malloc(workspace_bytes);
        if (!workspace) return 1;
        status = compute_tdt_loss(&problem, &options, costs, &grads, workspace, workspace_bytes);
    }
    if (status != TDT_STATUS_SUCCESS) {
        fprintf(stderr, "warp-tdt: %s\n  %s\n", tdt_status_string(status), tdt_last_error());
        return 1;
    }
    for (b = 0; b < B; ++b) printf("cost[%d] = %.6f\n", b, costs[b]);
    printf("d cost / d joint[0, 0, 0, :3] = %.6f %.6f %.6f\n", joint_grad[0], joint_grad[1], joint_grad[2]);

    free(workspace);
    free(joint_grad);
    free(joint);
    return isfinite(costs[0]) && isfinite(costs[1]) ? 0 : 1;
}
