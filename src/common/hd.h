/*
 * hd.h - the host/device macro the shared lattice math is written with.
 *
 * TDT_HD marks a small function that is compiled for the host by the C11 compiler (OpenMP
 * backend) and for both host and device by nvcc (CUDA backend), so the math in lattice.h,
 * dtype.h and workspace.h exists once.
 */
#ifndef TDT_COMMON_HD_H
#define TDT_COMMON_HD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define TDT_HD static __host__ __device__ __forceinline__
#else
#define TDT_HD static inline
#endif

/* TDT_FOR_ARCS(k, A) { ... }: the loop over the arcs of a node, k = 0 .. A->count - 1. In
 * device code it is written with the constant bound TDT_MAX_DURATIONS and fully unrolled, so
 * when a kernel makes A->count a compile-time constant the guards fold away, each arc's loads
 * issue together instead of one arc's load waiting on the previous arc's log-add, and the arc
 * arrays stay in registers. Elsewhere (and in a CUDA file that defines TDT_ARCS_NO_UNROLL, for
 * kernels whose count stays a runtime value) it is the plain loop. Same arcs, same order. */
#if defined(__CUDACC__) && !defined(TDT_ARCS_NO_UNROLL)
#define TDT_FOR_ARCS(k, A) \
    _Pragma("unroll") for (int k = 0; k < TDT_MAX_DURATIONS; ++k) if (k < (A)->count)
#else
#define TDT_FOR_ARCS(k, A) for (int k = 0; k < (A)->count; ++k)
#endif

/* TDT_UNROLL for (...): a loop of constant trip count, unrolled by either compiler. */
#if defined(__CUDACC__)
#define TDT_UNROLL _Pragma("unroll")
#else
#define TDT_UNROLL _Pragma("GCC unroll 16")
#endif

/* +infinity as a double; INFINITY works in host and device code alike. */
#define TDT_INF ((double)INFINITY)

#endif /* TDT_COMMON_HD_H */
