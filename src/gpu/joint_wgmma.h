/*
 * joint_wgmma.h - the GEMM schedule's products on Hopper's wgmma (src/gpu/sm90a/joint_wgmma.cu,
 * compiled for sm_90a alone; built where nvcc has sm_90a, TDT_HAVE_WGMMA): the forward's
 * log-normalisers, the backward's dz, and the chip backward's d W and d h. float16 and bfloat16
 * operands, float32 sums.
 */
#ifndef TDT_GPU_JOINT_WGMMA_H
#define TDT_GPU_JOINT_WGMMA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* Whether the kernel runs on a device of compute capability cc_major.cc_minor with smem_optin
 * bytes of shared memory a block (opt-in) for a hidden size H: compute capability 9.0 and h's
 * ceil(H / 64) chunks of 128 nodes in its shared memory (H <= 640 on the H100 and H200). */
bool tdt_gpu_wgmma_fits(int cc_major, int cc_minor, int smem_optin, int64_t H);
/* The bytes of W's V token rows packed for the kernel (a multiple of 16 KB). */
size_t tdt_gpu_wgmma_pack_bytes(int64_t V, int64_t H);
/* W's first V rows (16-bit values, pitch ldw, columns < H) packed into Wp (16-byte aligned,
 * tdt_gpu_wgmma_pack_bytes), on stream. */
cudaError_t tdt_gpu_wgmma_pack(const void *W, int64_t ldw, int64_t V, int64_t H, void *Wp, int num_sms,
                               cudaStream_t stream);
/* lse[n] = log sum_v exp(h[n] . W[v] + bias[v]) over v < V for the count rows of h (16-bit
 * values, float16 where f16 else bfloat16, pitch ldh a multiple of 8, columns < H taken), W
 * packed as above, bias (V values of the same type) or NULL; on stream. A NaN in a row's values
 * makes its lse NaN; a row past float32's range gives inf or NaN (the caller recomputes it). */
cudaError_t tdt_gpu_wgmma_lse(int f16, const void *h, int64_t ldh, const void *Wp, const void *bias, int64_t V,
                              int64_t H, int64_t count, float *lse, cudaStream_t stream);

/* A row of dz's coefficients for tdt_gpu_wgmma_dz (base 2): dz_v = scale min(2^(x_v K - ref) occ,
 * cl) for x_v = z_v + bias_v, K = log2(e); valid = 0: a row of zeros. For tdt_gpu_wgmma_dw: y,
 * the node's label column (-1: none), whose value, as the blank's and the durations', is not the
 * formula's; rare = 1 (with valid = 0): a node whose whole row is not the formula's (its lse past
 * the base-2 reference's range). */
struct tdt_wgmma_dz_row {
    float ref, occ, cl, scale;
    int valid, y, rare, pad;
};
/* dz (16-bit values, float16 where f16 else bfloat16, pitch ldz) for the count rows of h (as
 * tdt_gpu_wgmma_lse's) and their coefficients rows: its first V columns, on stream; the columns
 * from V on are left as they are. W's rows are split over blocks where the rows alone would
 * leave some of the num_sms multiprocessors idle. */
cudaError_t tdt_gpu_wgmma_dz(int f16, const void *h, int64_t ldh, const void *Wp, const void *bias, int64_t V,
                             int64_t H, int64_t count, const tdt_wgmma_dz_row *rows, void *dz, int64_t ldz, int num_sms,
                             cudaStream_t stream);

/* d W and d bias on the chip (TDT_GPU_JOINT_BWD=chip): wacc[o ldw + c] += sum_n dz[n, o] h[n, c]
 * for the token and duration rows o < O, columns c < H, and wacc[o ldw + H] += sum_n dz[n, o],
 * over count nodes whose rows of h are packed in hp as tdt_gpu_wgmma_pack packs W (count rows),
 * with dz's values formed on the chip: from z recomputed there (W's O rows packed in Wp,
 * tdt_gpu_wgmma_pack with O rows), bias and rows' coefficients for the token columns v < V but
 * the blank's and the label's; those and the durations' from the node's known values kn[n kp +
 * i] (the blank's, the label's, then the D durations', kp = 2 + D, float32); zero for a node
 * whose row is not valid (a rare row: the caller adds its terms). One block owns 64 of W's rows
 * and adds into them once: the order of the sums is fixed. On stream. */
cudaError_t tdt_gpu_wgmma_dw(int f16, const void *hp, const void *Wp, const void *bias, int64_t V, int64_t O,
                             int64_t blank, int64_t H, int64_t count, const tdt_wgmma_dz_row *rows, const float *kn,
                             int kp, float *wacc, int64_t ldw, cudaStream_t stream);

/* d h on the chip (TDT_GPU_JOINT_BWD=chip): dh[n H + c] = sum_o dz[n, o] W[o, c] for the count
 * rows of h (as tdt_gpu_wgmma_lse's), columns c < H, over W's O token and duration rows packed
 * in Wp as tdt_gpu_wgmma_dw's, dz's values formed on the chip as tdt_gpu_wgmma_dw forms them
 * (rows, kn and kp as there); dh float32, pitch H, every value written (zeros for a node that
 * is not valid). On stream. */
cudaError_t tdt_gpu_wgmma_dh(int f16, const void *h, int64_t ldh, const void *Wp, const void *bias, int64_t V,
                             int64_t O, int64_t blank, int64_t H, int64_t count, const tdt_wgmma_dz_row *rows,
                             const float *kn, int kp, float *dh, cudaStream_t stream);

#endif
