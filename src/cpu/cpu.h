/*
 * cpu.h - what the CPU backend's loss (cpu.c) lends its fused joint + loss (joint.c): the joint
 * fills the same node blocks by its own means and then runs the same lattice pass, and forms
 * its logits' gradient with the same per-node coefficients and row kernels, so the loss's math
 * exists once.
 */
#ifndef TDT_CPU_CPU_H
#define TDT_CPU_CPU_H

#include "internal.h"

/* The forward once the node blocks are filled: alpha (and beta unless c->costs_only), the costs,
 * options.reduction, and the workspace header that a backward checks, with magic
 * (TDT_WS_MAGIC for the loss, TDT_WS_JOINT_MAGIC for the joint; 0 after a costs-only call). */
void tdt_cpu_forward_lattice(const tdt_call_t *c, const tdt_ws_t *ws, int nthreads, uint64_t magic);

/* SUCCESS when the workspace holds a forward of c's problem written with magic, else
 * TDT_STATUS_INVALID_WORKSPACE with the error detail set. */
tdt_status_t tdt_cpu_check_forward(const tdt_call_t *c, const tdt_ws_t *ws, uint64_t magic);

/* Nodes of a row that one tdt_cpu_node_coeffs call takes at most. */
#define TDT_CPU_COEFF_NODES 16

/* The gradient coefficients of nodes (b, t, u0 + i), i < nn <= TDT_CPU_COEFF_NODES, of the
 * padded extent into ng[i] (all zero off the lattice and for an infeasible sample), and with q
 * non-NULL their duration probabilities exp(lp_dur) into q[i * D + k] (0 off the lattice). */
void tdt_cpu_node_coeffs(const tdt_call_t *c, const tdt_ws_t *ws, int64_t b, int64_t t,
                         int64_t u0, int nn, tdt_node_grad_t *ng, double *q);

/* log sum_v exp(z_v) of a row of V float32 (acc_double 0) or float64 values, as the loss's node
 * pass computes it for rows of that dtype. */
double tdt_cpu_row_lse(const void *z, int64_t V, int acc_double);

/* The token gradient of a row of V float32 (acc_double 0) or float64 logits z into g (g may be
 * z), as the loss's gradient pass writes it for logits of that dtype: scale times
 * tdt_token_grad of softmax(z) with the node's coefficients ng, the blank and label (none:
 * label < 0) patched, clamp applied. blank and clamp as in options. */
void tdt_cpu_token_grad(const void *z, void *g, int64_t V, int acc_double, int blank, double clamp,
                        double lse, const tdt_node_grad_t *ng, int32_t label, double scale);

#endif /* TDT_CPU_CPU_H */
