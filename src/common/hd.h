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

/* +infinity as a double; INFINITY works in host and device code alike. */
#define TDT_INF ((double)INFINITY)

#endif /* TDT_COMMON_HD_H */
