/*
 * joint_gemm.cu - the GPU fused joint's GEMM schedule (TDT_GPU_JOINT=gemm; joint.cu picks it):
 * the lattice's nodes in chunks of G consecutive (b, t) rows (joint_plan.h), each chunk's
 * matrix products on cuBLASLt's kernels (tensor cores for float16 and bfloat16), the chunk's
 * logits held in the scratch (about 128 MB), never the whole problem's.
 *
 * First W is copied into g_wp, its rows padded from O to ldz (a multiple of 8) with zeros and its
 * columns from H to ldh: the bias, then TDT_JOINT_LSE_PARTS columns of ones. Every product's
 * dimensions and pitches are then multiples of 8, where cuBLASLt has its vectorised kernels
 * (joint_plan.h), and the z product adds the bias. Per chunk of N = G (U + 1) nodes in the
 * forward, N_b = G_b (U + 1) in the backward (joint_plan.h), in the padded (b, t, u) order:
 *   forward   h = dropout(act(enc + pred)) into g_h (the dtype, zero rows for the nodes that
 *             are not valid, a 1 at column H; for float16 and bfloat16 the node's blank, label
 *             and duration logits into its block and its shift -c after the 1: fwd_keys);
 *             z + bias (- c) = [h 1 -c 0] [W bias 1]^T (cuBLASLt, in the dtype) into g_z; per
 *             node, from its row, the node's block as joint_fwd_kernel writes it (the
 *             log-normaliser over the V token rows, the blank and label logits, the duration
 *             log-softmax). Then the sweeps (joint.cu).
 *   backward  h again, and for float16 and bfloat16 the node's -lse (from its block) in h's
 *             columns after the 1, split into TDT_JOINT_LSE_PARTS values of the dtype; the z
 *             product again, now into the dtype: z + bias - lse, the node's log-probabilities
 *             (z + bias for float32 and float64). Per node dz from them (its coefficients by
 *             node_setup_bwd, a thread a node: gemm_coef_kernel), in place (zero rows for
 *             nodes outside a feasible lattice, zeros from O to ldz); d W and d bias +=
 *             dz^T [h 1] (cuBLASLt, beta 1, in g_w: h's
 *             column of ones gives d bias); d h = dz W (cuBLASLt) into g_dx, then
 *             d(enc + pred) = d h * the dropout's factor * act' in place, and joint_common.cuh's
 *             reductions into d enc (over u) and d pred (chunks in order, then over t). At the
 *             end d pred, d W and d bias are written in the dtype.
 * So four products of 2 N ldh (V + D) for N nodes, forward and backward together, as the tiles'
 * schedule has five; cuBLASLt picks each product's kernel for the device, once a call (every
 * chunk has the same shapes and buffers).
 *
 * float32's products are split unless TDT_GPU_JOINT_FLOAT32=sgemm asks for float32 kernels
 * (joint.cu): W padded, h and dz each as three bfloat16 parts whose sum is the float32 value
 * exactly (tdt_split3), and a product as the six products of parts whose indices add up to at
 * most 2, on bfloat16 tensor cores: the z product as one product of six times the inner size
 * (W's and h's rows hold the parts in six blocks, joint_plan.h), d h as six products into the
 * same float32 sums, d W as three over the nodes stacked ([dz0; dz1; dz2] against h's parts
 * [h2; h1; h0] and its tails). The three products left out are at most 2^-23 of the whole. A dz
 * row with a value that is not finite goes in as zeros, its terms added in float32 by
 * split_fix_dw_kernel and split_fix_dh_kernel. The float32 kernels take 1.2-1.6x the time
 * (docs/joint.md).
 *
 * On Hopper (sm_90a, float16 and bfloat16, H <= 640) the forward's log-normalisers come from wgmma
 * (tdt_gpu_wgmma_lse: z never written); TDT_GPU_JOINT_BWD=wgmma takes the backward's dz from wgmma
 * too, and TDT_GPU_JOINT_BWD=chip takes the chip backward (backward_chip): with the plan's chip
 * layout (joint_plan.h) no dz and no z are written; two sweeps over chunks of rows recompute z
 * on the chip, the first for d W and d bias (tdt_gpu_wgmma_dw), the second for d h
 * (tdt_gpu_wgmma_dh), dz's values formed there from the nodes' coefficients (gemm_coef_kernel),
 * a row past the base-2 reference's range taken one at a time (chip_rare_kernel).
 *
 * skip_below (outside graph capture): the backward lists the nodes it keeps (keep_rows_kernel,
 * keep_scan_kernel), reads their number back, and its chunks are runs of that list
 * (keep_chunk_kernel; chunk_node and the reductions of joint_common.cuh map through it), so a
 * left-out node costs no product.
 *
 * Precision: the products' sums in the accumulate type, as the tiles' schedule; h and dz rounded
 * to the dtype where it is float16 or bfloat16 (the tensor cores' operands), and the forward's z
 * less its shift c (fwd_shifted: the largest term and the blank, label and duration logits
 * recomputed from h and W unrounded). The log-normaliser and the bulk of dz as the unfused path has them (gpu_common.cuh's
 * base-2 units for the float-accumulate types: about 2 ulp a term; natural units for float64 and
 * for values beyond 1e7); the blank, the label and the durations in float64 from the forward's
 * node block. In float16 and bfloat16 the backward reads each bulk term's log-probability
 * rounded to the dtype (half the bytes of z in the accumulate type; the unfused path rounds the
 * logits themselves, which loses more where |z| is large): a term's relative error is at most
 * |log p| 2^-9 (bfloat16), below the dtype's own rounding of dz where p > 1/e, and largest,
 * 0.07 % of tok_occ absolute, near p = 1/e.
 *
 * Deterministic: cuBLASLt gives the same bits for the same problem, kernel and device; d W
 * and d bias add the chunks in order (no atomics anywhere).
 *
 * cuBLASLt is loaded with dlopen at the first call of this schedule (libcublasLt.so of the
 * toolkit's major version): the library does not link it, so a build with CUDA loads and runs
 * where it is missing, and this schedule then fails with TDT_STATUS_CUDA_ERROR saying so. One
 * cuBLASLt handle a device is kept for the process. No allocation (cuBLASLt's workspace is
 * g_lt), no host synchronisation; capturable in a CUDA graph.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <mutex>

#include <cublasLt.h>

#include "joint_common.cuh"
#include "joint_wgmma.h" /* declarations; their definitions are built where TDT_HAVE_WGMMA */

namespace {

/* ---- cuBLASLt, loaded once ------------------------------------------------------------------- */

struct lt_api {
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
    int ok;
    char why[256]; /* when not ok */
};

lt_api lt_load() {
    lt_api a;
    memset(&a, 0, sizeof a);
    /* the loader's search path first (the toolkit's or a wheel's copy, already loaded by
     * PyTorch), then the toolkit's default place */
    char name[64], full[96];
    snprintf(name, sizeof name, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    snprintf(full, sizeof full, "/usr/local/cuda/lib64/%s", name);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(a.why, sizeof a.why, "%s", e ? e : name);
        h = dlopen(full, RTLD_NOW | RTLD_LOCAL);
        if (!h) return a;
    }
    int missing = 0;
#define TDT_LT_SYM(field, sym)                                                                   \
    a.field = reinterpret_cast<decltype(a.field)>(dlsym(h, #sym));                               \
    if (!a.field && !missing) {                                                                  \
        snprintf(a.why, sizeof a.why, "%s has no %s", name, #sym);                               \
        missing = 1;                                                                             \
    }
    TDT_LT_SYM(create, cublasLtCreate)
    TDT_LT_SYM(desc_create, cublasLtMatmulDescCreate)
    TDT_LT_SYM(desc_destroy, cublasLtMatmulDescDestroy)
    TDT_LT_SYM(desc_set, cublasLtMatmulDescSetAttribute)
    TDT_LT_SYM(layout_create, cublasLtMatrixLayoutCreate)
    TDT_LT_SYM(layout_destroy, cublasLtMatrixLayoutDestroy)
    TDT_LT_SYM(pref_create, cublasLtMatmulPreferenceCreate)
    TDT_LT_SYM(pref_destroy, cublasLtMatmulPreferenceDestroy)
    TDT_LT_SYM(pref_set, cublasLtMatmulPreferenceSetAttribute)
    TDT_LT_SYM(heuristic, cublasLtMatmulAlgoGetHeuristic)
    TDT_LT_SYM(matmul, cublasLtMatmul)
#undef TDT_LT_SYM
    a.ok = !missing; /* the library stays loaded for the process */
    return a;
}

const lt_api &lt() {
    static const lt_api api = lt_load(); /* thread-safe initialisation */
    return api;
}

/* The process's handle for device (created at its first use), or NULL with *s set. */
cublasLtHandle_t lt_handle(int device, cublasStatus_t *s) {
    enum { kDevices = 64 };
    static std::mutex mu;
    static cublasLtHandle_t handles[kDevices];
    *s = CUBLAS_STATUS_SUCCESS;
    if (device < 0 || device >= kDevices) {
        *s = CUBLAS_STATUS_NOT_SUPPORTED;
        return NULL;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!handles[device]) *s = lt().create(&handles[device]);
    return *s == CUBLAS_STATUS_SUCCESS ? handles[device] : NULL;
}

tdt_status_t lt_fail(cublasStatus_t s, const char *what) {
    tdt_set_error("the GPU joint's GEMM schedule: %s failed (cuBLAS status %d)", what, (int)s);
    return TDT_STATUS_CUDA_ERROR;
}

/* The largest power of two (at most 256) that divides p's address: cuBLASLt's alignment. */
uint32_t align_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
    return a;
}

/* Which of cuBLASLt's kernels a product takes (joint.cu's TDT_GPU_JOINT_LT): its heuristic's
 * first, or of its first kLtCandidates the one with the fewest waves (the largest tiles; the
 * first of those on a tie), or by product (the default): the first for z, the fewest waves for
 * d W and d h. Measured in bfloat16 on an H100 (docs/joint.md): the fewest waves took
 * huge-joint's backward from 25.9 to 23.5 ms, but z's forward from 11.15 to 11.45 ms there and
 * from 1.54 to 1.70 ms at parakeet-joint. */
const int kLtCandidates = 8;

int lt_choose(const cublasLtMatmulHeuristicResult_t *r, int found, int pick) {
    int best = -1;
    for (int i = 0; i < found; ++i) {
        if (r[i].state != CUBLAS_STATUS_SUCCESS) continue;
        if (best < 0) best = i;
        if (pick == TDT_LT_FIRST) break;
        if (r[i].wavesCount > 0.0f && (!(r[best].wavesCount > 0.0f) || r[i].wavesCount < r[best].wavesCount)) best = i;
    }
    return best;
}

/* One product D = alpha op(A) op(B) + beta D of column-major matrices (cuBLASLt's view: a
 * row-major (rows, cols) array of pitch ld is a column-major (cols, rows) one), its kernel
 * chosen once. */
struct lt_gemm {
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulAlgo_t algo;
    size_t ws_need = 0;

    /* m x n = op(A) (m x k) op(B) (k x n); A stored as (ta ? k x m : m x k) with pitch lda,
     * B as (tb ? n x k : k x n) with pitch ldb, D as m x n with pitch ldd. The kernel: pick's
     * (lt_pick) among cuBLASLt's first kLtCandidates for the problem. */
    cublasStatus_t init(cublasLtHandle_t h, int pick, cublasComputeType_t compute, cudaDataType_t scale,
                        cudaDataType_t ab, cudaDataType_t dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        const void *A, int64_t lda, const void *B, int64_t ldb, const void *D, int64_t ldd,
                        size_t ws_bytes) {
        const lt_api &L = lt();
        cublasStatus_t s;
        if ((s = L.desc_create(&desc, compute, scale)) != CUBLAS_STATUS_SUCCESS) return s;
        const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        if ((s = L.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) != CUBLAS_STATUS_SUCCESS) return s;
        if ((s = L.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) != CUBLAS_STATUS_SUCCESS) return s;
        if ((s = L.layout_create(&la, ab, ta ? k : m, ta ? m : k, lda)) != CUBLAS_STATUS_SUCCESS) return s;
        if ((s = L.layout_create(&lb, ab, tb ? n : k, tb ? k : n, ldb)) != CUBLAS_STATUS_SUCCESS) return s;
        if ((s = L.layout_create(&ld, dt, m, n, ldd)) != CUBLAS_STATUS_SUCCESS) return s;
        cublasLtMatmulPreference_t pref = NULL;
        if ((s = L.pref_create(&pref)) != CUBLAS_STATUS_SUCCESS) return s;
        const uint64_t wsb = ws_bytes;
        const uint32_t aa = align_of(A), ab_ = align_of(B), ad = align_of(D);
        s = L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
        if (s == CUBLAS_STATUS_SUCCESS) s = L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
        if (s == CUBLAS_STATUS_SUCCESS) s = L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab_, sizeof ab_);
        if (s == CUBLAS_STATUS_SUCCESS) s = L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
        if (s == CUBLAS_STATUS_SUCCESS) s = L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
        cublasLtMatmulHeuristicResult_t r[kLtCandidates];
        memset(r, 0, sizeof r);
        int found = 0;
        if (s == CUBLAS_STATUS_SUCCESS)
            s = L.heuristic(h, desc, la, lb, ld, ld, pref, pick == TDT_LT_FIRST ? 1 : kLtCandidates, r, &found);
        L.pref_destroy(pref);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
        const int i = lt_choose(r, found, pick);
        if (i < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
        algo = r[i].algo;
        ws_need = r[i].workspaceSize;
        return CUBLAS_STATUS_SUCCESS;
    }
    cublasStatus_t run(cublasLtHandle_t h, const void *alpha, const void *A, const void *B, const void *beta, void *D,
                       void *ws, size_t ws_bytes, cudaStream_t stream) const {
        return lt().matmul(h, desc, alpha, A, la, B, lb, beta, D, ld, D, ld, &algo, ws, ws_bytes, stream);
    }
    ~lt_gemm() {
        if (!lt().ok) return;
        if (ld) lt().layout_destroy(ld);
        if (lb) lt().layout_destroy(lb);
        if (la) lt().layout_destroy(la);
        if (desc) lt().desc_destroy(desc);
    }
};

template <int DT> struct lt_types;
template <> struct lt_types<TDT_DTYPE_FLOAT32> {
    static const cudaDataType_t ab = CUDA_R_32F, d = CUDA_R_32F, scale = CUDA_R_32F;
    static const cublasComputeType_t compute = CUBLAS_COMPUTE_32F; /* never TF32 */
};
template <> struct lt_types<TDT_DTYPE_FLOAT64> {
    static const cudaDataType_t ab = CUDA_R_64F, d = CUDA_R_64F, scale = CUDA_R_64F;
    static const cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
};
template <> struct lt_types<TDT_DTYPE_FLOAT16> {
    static const cudaDataType_t ab = CUDA_R_16F, d = CUDA_R_32F, scale = CUDA_R_32F;
    static const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
template <> struct lt_types<TDT_DTYPE_BFLOAT16> {
    static const cudaDataType_t ab = CUDA_R_16BF, d = CUDA_R_32F, scale = CUDA_R_32F;
    static const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

/* ---- kernels --------------------------------------------------------------------------------- */

/* The row kernels' passes a batch (gemm_node_kernel's log-sum-exp, gemm_dz_kernel): 16-byte
 * loads in flight a lane. With one, the dz kernel took 2.4x its memory time (12.2 ms at
 * huge-joint bf16, 512 MB chunks, H100, commit 2a60fb6). */
const int kRowPasses = 4;

/* Whether node n (n < limit) enters the backward: valid as node_decode has it, in a feasible
 * sample (node_setup_bwd's rule, without its coefficients). */
__device__ __forceinline__ bool node_bwd(const joint_args &a, int64_t n, int64_t limit, node_info *ni) {
    int64_t Tb, Ub;
    node_decode(a, n, limit, ni, &Tb, &Ub);
    return ni->valid && sample_feasible(a, ni->b);
}

/* Whether the backward's z product gives a node's values less its log-normaliser lse (float16
 * and bfloat16: log-probabilities, which keep the dtype's 8 or 11 significant bits where the
 * probability matters, as the unfused path's logits cannot), not its logits: for |lse| <= 1e7
 * (not NaN), where float32's sum z - lse is as good as z itself. */
template <int DT> __device__ __forceinline__ bool lp_shift(double lse) {
    return sizeof(typename tdt_elem<DT>::T) < sizeof(acc_t<DT>) && fabs(lse) <= 1e7;
}

/* The value of W's padded columns of ones: 256 for float16, so that -lse / 256 fits its range
 * (|lse| <= 1e7); 1 otherwise. A power of two: -lse's parts stay exact. */
template <int DT> __host__ __device__ __forceinline__ double lse_unit() { return DT == TDT_DTYPE_FLOAT16 ? 256.0 : 1.0; }

/* Whether the forward's z product writes its values in the dtype (float16, bfloat16) less a
 * shift c a node, not in the accumulate type (half the bytes written and read): c is the
 * largest of the node's blank and label logits and 0, which the h kernel computes with the
 * node's duration logits from h and W (the product's operands, float32 sums) into the node's
 * block (fwd_keys); the node kernel takes the log-normaliser from the row, its largest term
 * recomputed the same way, c added back, and the blank, label and durations from the block.
 * A value's rounding is then of z - c, not z: small where the probability is (a trained
 * lattice's blank or label), and for the largest term none. float16's row holds (z - c) / 256
 * (the product's alpha), for the range; a row that leaves it is summed from the products. */
template <int DT> constexpr bool fwd_shifted() { return sizeof(typename tdt_elem<DT>::T) < sizeof(acc_t<DT>); }

/* The forward's z values in natural units from the row's: times lse_unit, 256 for float16
 * (fwd_shifted: W padded's column against -c holds it, and the product's alpha is its inverse). */
template <int DT> __device__ __forceinline__ float fwd_unit() { return (float)lse_unit<DT>(); }

/* Split products (float32): the part in each block of W's and of h's rows (TDT_JOINT_SPLIT_BLOCKS
 * blocks of ldh): block k of the z product pairs W's part w_part_of(k) with h's h_part_of(k), the
 * six pairs whose parts add up to at most 2 (the three dropped are at most 2^-23 of the
 * product); dz's three parts go one to a matrix (part_self). */
__device__ __forceinline__ int w_part_of(int k) { return k < 3 ? k : k == 4 ? 1 : 0; }
__device__ __forceinline__ int h_part_of(int k) { return k < 3 ? 0 : k < 5 ? 1 : 2; }
__device__ __forceinline__ int part_self(int k) { return k; }
__device__ __forceinline__ int reversed_part(int k) { return 2 - k; }

/* The four values v[0..3] of columns k0..k0 + 3 as their bfloat16 parts (joint_plan.h's
 * tdt_split3) into BLOCKS blocks at out, out + ldb, ...: block k gets part part_of(k), 8 bytes a
 * store. */
template <int BLOCKS, int (*part_of)(int)>
__device__ __forceinline__ void store_parts(uint16_t *out, int64_t ldb, int64_t k0, const float (&v)[4]) {
    uint16_t parts[4][3];
#pragma unroll
    for (int e = 0; e < 4; ++e) tdt_split3(v[e], parts[e]);
#pragma unroll
    for (int k = 0; k < BLOCKS; ++k) {
        const int i = part_of(k);
        uint2 raw;
        raw.x = (uint32_t)parts[0][i] | (uint32_t)parts[1][i] << 16;
        raw.y = (uint32_t)parts[2][i] | (uint32_t)parts[3][i] << 16;
        *reinterpret_cast<uint2 *>(out + k * ldb + k0) = raw;
    }
}

/* A row of z in 16-byte vectors of N values of type A (the accumulate type, or the dtype's bits
 * in the backward): rows start 16-byte aligned (the pitch ldz is a multiple of 8), and the last
 * O mod N values are the row's scalar tail. */
template <typename A> struct zvec {
    enum { N = 16 / (int)sizeof(A) };
    A v[N];
    __device__ __forceinline__ void load(const A *p) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(p);
        memcpy(v, &raw, sizeof raw);
    }
    __device__ __forceinline__ void store(A *p) const {
        uint4 raw;
        memcpy(&raw, v, sizeof raw);
        *reinterpret_cast<uint4 *>(p) = raw;
    }
    __device__ __forceinline__ A at(int j) const { return v[j]; } /* a batch for lse_add */
};

/* z + bias - (what h's columns after its 1 carry) at outputs rows[0 .. n) (n <= R) of a node whose
 * h is row (pitch ldh, the dtype), as the z product has them: against W padded's rows, each lane
 * its 16-byte vectors (the rows' loads in flight together), float32 sums joined by a fixed
 * xor-shuffle tree; every lane gets them. fwd_dot: one output. */
template <int DT, int R>
__device__ __forceinline__ void fwd_dots(const typename tdt_elem<DT>::T *row, const typename tdt_elem<DT>::T *wp,
                                         int64_t ldh, const int64_t (&rows)[R], int n, int lane, float (&out)[R]) {
    typedef tdt_elem<DT> TE;
    typedef typename TE::T E;
    enum { N = zvec<E>::N };
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = 0.0f;
    for (int64_t k0 = (int64_t)lane * N; k0 < ldh; k0 += 32 * N) {
        zvec<E> x, w[R];
        x.load(row + k0);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < n) w[r].load(wp + rows[r] * ldh + k0);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < n) {
#pragma unroll
                for (int e = 0; e < N; ++e) out[r] = fmaf(TE::to_acc(x.v[e]), TE::to_acc(w[r].v[e]), out[r]);
            }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int r = 0; r < R; ++r) out[r] += __shfl_xor_sync(0xffffffffu, out[r], off);
}
template <int DT>
__device__ __forceinline__ float fwd_dot(const typename tdt_elem<DT>::T *row, const typename tdt_elem<DT>::T *wp,
                                         int64_t ldh, int64_t o, int lane) {
    const int64_t rows[1] = {o};
    float out[1];
    fwd_dots<DT, 1>(row, wp, ldh, rows, 1, lane, out);
    return out[0];
}

/* fwd_keys' outputs at a time */
const int kKeyRows = 8;

/* The forward's logits of node ni that its block keeps (fwd_shifted), from its h in row (just
 * written by this warp, zeros after its 1): the blank's, the label's (0 without one) and the D
 * durations' into the block's places for their log-probabilities, and at the log-normaliser's
 * place the shift c: the largest of the blank's, the label's and 0, rounded to the dtype (in
 * units of fwd_unit), 0 where beyond 1e7 or not a number. -c / fwd_unit (exact) then goes into
 * row's column H + 1, whose column of W padded holds fwd_unit (lse_unit): the product gives
 * z + bias - c. */
template <int DT>
__device__ __forceinline__ void fwd_keys(const joint_args &a, const node_info &ni, typename tdt_elem<DT>::T *row,
                                         int64_t ldh, const typename tdt_elem<DT>::T *wp, int lane) {
    typedef tdt_elem<DT> TE;
    typedef typename TE::T E;
    __syncwarp();
    double *const w = tdt_wblock(&a.wb, ni.b, ni.t, ni.u);
    /* outputs i = 0 .. 2 + D - 1: the blank, the label (the blank again without one), the
     * durations; kKeyRows at a time */
    float zb = 0.0f, zy = 0.0f;
    for (int i0 = 0; i0 < 2 + a.D; i0 += kKeyRows) {
        int64_t rows[kKeyRows];
        float v[kKeyRows];
        const int n = 2 + a.D - i0 < kKeyRows ? 2 + a.D - i0 : kKeyRows;
#pragma unroll
        for (int r = 0; r < kKeyRows; ++r) {
            const int i = i0 + r;
            rows[r] = i == 0 ? a.blank : i == 1 ? (ni.y >= 0 ? ni.y : a.blank) : a.V + (i - 2);
        }
        fwd_dots<DT, kKeyRows>(row, wp, ldh, rows, n, lane, v);
#pragma unroll
        for (int r = 0; r < kKeyRows; ++r) {
            const int i = i0 + r;
            if (r >= n) continue;
            if (i == 0) zb = v[r];
            else if (i == 1) zy = ni.y >= 0 ? v[r] : 0.0f;
            else if (lane == 0) w[TDT_W_DUR + (i - 2)] = v[r];
        }
    }
    float m = ni.y >= 0 && zy > zb ? zy : zb;
    if (!(m > 0.0f)) m = 0.0f; /* never below 0: where both are improbable, z's own rounding */
    const E cu = TE::from_acc(m / fwd_unit<DT>());
    double c = (double)TE::to_acc(cu) * fwd_unit<DT>();
    if (!(fabs(c) <= 1e7)) c = 0.0;
    if (lane != 0) return;
    w[TDT_W_BLANK] = zb;
    w[TDT_W_LABEL] = zy;
    w[tdt_w_lse(a.D)] = c;
    row[a.H + 1] = TE::from_double(-c / fwd_unit<DT>());
}

/* Where column k of node j's h is in h packed as tdt_gpu_wgmma_pack packs W (the chip backward's
 * d W sweep): tiles of 128 nodes, kc chunks of 64 columns a tile, a chunk 128 rows of 128 bytes
 * whose 16-byte units are swizzled (unit u of row r at u ^ (r % 8)); in 16-bit values */
__device__ __forceinline__ int64_t chip_h_at(int64_t j, int64_t k, int kc) {
    const int64_t r = j & 127;
    return (((j >> 7) * kc + (k >> 6)) * 128 + r) * 64 + ((((k >> 3) & 7) ^ (r & 7)) << 3) + (k & 7);
}

/* The h kernel's blocks an SM, for its registers: 4 for float16 and bfloat16 (64 registers and
 * a few bytes spilled, for 80 and 3 blocks without the bound: at huge-joint in bfloat16 the
 * forward's h kernels took 1.20 ms for 1.32, the backward's 0.69 for 0.80, docs/joint.md), none
 * for float32 and float64 (the bound raised their registers, and float32's step took up to 1 %
 * longer). The packed form (gemm_h_kernel's PACKED) takes 3: 80 registers, where 4 spilled 108
 * bytes. */
template <int DT, bool PACKED = false> constexpr int h_min_blocks() {
    return PACKED ? 3 : sizeof(typename tdt_elem<DT>::T) == 2 ? 4 : 0;
}

/* Warp w of block i: node first + j's h (j = 8 i + w < count; in the backward the chunk's node j,
 * chunk_node) into row j of hs (pitch ldh, the dtype), each lane 16 bytes at a time, zero where the
 * node is not taken (backward: not in a feasible lattice) and past H, but for a 1 at column H (the
 * bias's operand in the z product; in the d W product it makes column H of d W the sum of dz over
 * the nodes, d bias) and, in the backward of a node with lp_shift, -lse / lse_unit in the next
 * TDT_JOINT_LSE_PARTS columns (against W's padded columns of lse_unit): its value in the dtype,
 * then the rest's, and so on (bfloat16: 24 significant bits together; float16: 33 less what its
 * subnormals lose, at worst 8e-6 absolute where |lse| < 100). With split products (float32, split
 * not NULL) h's three bfloat16 parts go into row j of split instead, in the blocks joint_plan.h
 * gives them, and where stacked is not NULL (the backward) into row j of the matrices stacked,
 * stacked + stack_ld and stacked + 2 stack_ld as well: parts 2, 1 and 0, pitch ldh (the d W
 * products' operand). In the forward of float16 and bfloat16 (fwd_shifted) the node's exact
 * logits and its shift c go into its block and -c / unit into column H + 1 (fwd_keys; W padded
 * is wp, pitch ldh). PACKED (the chip backward's d W sweep, 16-bit dtypes): hs holds h packed
 * instead (chip_h_at: tiles of 128 nodes, pack_kc chunks of 64 columns), the columns below H,
 * zeros after them and in the last tile's nodes from count on, which the launch's blocks cover
 * too. */
template <int DT, bool PACKED = false>
__global__ void __launch_bounds__(256, h_min_blocks<DT, PACKED>())
    gemm_h_kernel(const __grid_constant__ joint_args a, int64_t first, int64_t limit, int64_t count,
                  typename tdt_elem<DT>::T *hs, int64_t ldh, int backward, uint16_t *split, uint16_t *stacked,
                  int64_t stack_ld, const typename tdt_elem<DT>::T *wp, int pack_kc) {
    typedef tdt_elem<DT> TE;
    typedef typename TE::T E;
    enum { N = zvec<E>::N };
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (j >= (PACKED ? (count + 127) / 128 * 128 : count)) return; /* warp-uniform */
    node_info ni; /* every lane decodes the node: the same loads */
    int take;
    double nlse = 0.0; /* -lse, or 0 */
    if (PACKED && j >= count) { /* a packed tile's padding: zeros */
        ni = node_info{};
        take = 0;
    } else if (backward) {
        int64_t lim;
        const int64_t n = chunk_node(a, first, limit, j, &lim);
        take = node_bwd(a, n, lim, &ni);
        if (take) {
            const double lse = tdt_wblock(&a.wb, ni.b, ni.t, ni.u)[tdt_w_lse(a.D)];
            if (lp_shift<DT>(lse)) nlse = -lse;
        }
    } else {
        int64_t Tb, Ub;
        node_decode(a, first + j, limit, &ni, &Tb, &Ub);
        take = ni.valid;
    }
    /* packed: the start of the node's row in its tile's first chunk */
    E *const row = PACKED ? hs + chip_h_at(j, 0, pack_kc) - ((j & 7) << 3) : hs + j * ldh;
    /* enc's and pred's rows: 16-byte loads where both rows start 16-byte aligned */
    const E *er, *pr;
    const bool vec = hidden_rows<DT, N>(a, ni, &er, &pr) && take;
    const int64_t width = PACKED ? (int64_t)pack_kc * 64 : ldh; /* a multiple of 8 */
    for (int64_t k0 = (int64_t)lane * N; k0 < width; k0 += 32 * N) {
        zvec<E> out;
        if (vec && k0 + N <= a.H) { /* hidden()'s values */
            hidden_vals<DT, N> hv;
            hv.load(a, ni, er, pr, k0);
#pragma unroll
            for (int e = 0; e < N; ++e) out.v[e] = TE::from_acc(hidden_of(a.act, hv.x[e], hv.keep[e]));
        } else {
#pragma unroll
            for (int e = 0; e < N; ++e) {
                const int64_t k = k0 + e;
                acc_t<DT> h = 0, x, keep;
                if (take && k < a.H) h = hidden<DT>(a, ni, k, &x, &keep);
                E v = TE::from_acc(k == a.H && !PACKED ? (acc_t<DT>)1 : h);
                if (!PACKED && k > a.H && k <= a.H + TDT_JOINT_LSE_PARTS) {
                    double rest = nlse / lse_unit<DT>();
                    for (int64_t i = a.H; i < k; ++i) {
                        v = TE::from_double(rest);
                        rest -= (double)TE::to_acc(v);
                    }
                }
                out.v[e] = v;
            }
        }
        if constexpr (DT == TDT_DTYPE_FLOAT32) {
            if (split) { /* split products: h's parts, six blocks of ldh */
                store_parts<TDT_JOINT_SPLIT_BLOCKS, h_part_of>(split + j * TDT_JOINT_SPLIT_BLOCKS * ldh, ldh, k0, out.v);
                if (stacked) store_parts<3, reversed_part>(stacked + j * ldh, stack_ld, k0, out.v);
                continue;
            }
        }
        if constexpr (PACKED) { /* at chip_h_at(j, k0, pack_kc) */
            out.store(row + (k0 >> 6) * 8192 + ((((k0 >> 3) & 7) ^ (j & 7)) << 3));
            continue;
        }
        out.store(row + k0);
    }
    if constexpr (fwd_shifted<DT>()) {
        if (!backward && take) fwd_keys<DT>(a, ni, row, ldh, wp, lane);
    }
}

/* A lane's batch of a row of 16-byte vectors: x[p] = vector q0 + 32 p + lane of row, for those
 * below nv (the loads in flight together). */
template <typename A>
__device__ __forceinline__ void load_passes(zvec<A> (&x)[kRowPasses], const A *row, int64_t q0, int64_t nv, int lane) {
#pragma unroll
    for (int p = 0; p < kRowPasses; ++p) {
        const int64_t q = q0 + 32 * p + lane;
        if (q < nv) x[p].load(row + q * zvec<A>::N);
    }
}

/* N values of a row of z (bias included; accumulate type): gpu_common.cuh's batch for lse_add. */
template <typename A, int N_> struct zbatch {
    enum { N = N_ };
    A v[N_];
    __device__ __forceinline__ A at(int j) const { return v[j]; }
};

/* A value of the forward's row of z in the accumulate type, in natural units (fwd_unit). */
template <int DT> __device__ __forceinline__ acc_t<DT> zrow_value(typename tdt_elem<DT>::T v) {
    const acc_t<DT> x = tdt_elem<DT>::to_acc(v);
    if constexpr (DT == TDT_DTYPE_FLOAT16) return x * fwd_unit<DT>();
    return x;
}

/* A 16-byte vector of that row as a batch for lse_add (zrow_value each). */
template <int DT> struct zrow_batch {
    typedef typename tdt_elem<DT>::T E;
    enum { N = zvec<E>::N };
    const zvec<E> &x;
    __device__ __forceinline__ acc_t<DT> at(int j) const { return zrow_value<DT>(x.v[j]); }
};

/* A row's largest value and where it is (the first such place): a lane's, then the warp's. */
struct row_top {
    float v;
    int64_t i;
    __device__ __forceinline__ void see(float x, int64_t at) {
        if (x > v) {
            v = x;
            i = at;
        }
    }
    /* the lanes' joined by an xor-shuffle tree: the larger value, on a tie the smaller place */
    __device__ __forceinline__ void join() {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, off);
            const int64_t oi = __shfl_xor_sync(0xffffffffu, i, off);
            if (ov > v || (ov == v && oi < i)) {
                v = ov;
                i = oi;
            }
        }
    }
};

/* The log-sum-exp of the first V values of the forward's row zr (the dtype; bias included, less
 * the node's shift where fwd_shifted) in the units X, the lanes of a warp together (gpu_common.cuh's
 * lse_lane, lse_add, lse_group: the unfused normaliser's, from the reference zb, the blank's
 * value in the row's terms); every lane gets the result (float64, natural units), and *huge
 * (warp-uniform) where the row needs natural units (tdt_rexp2::fits). With TOP, *top the row's
 * largest value (natural units) and its place, every lane. */
template <int DT, typename X, bool TOP>
__device__ __forceinline__ double row_lse(const joint_args &a, const typename tdt_elem<DT>::T *zr, acc_t<DT> zb,
                                          int lane, int *huge, row_top *top) {
    typedef acc_t<DT> A;
    typedef typename tdt_elem<DT>::T E;
    enum { N = zvec<E>::N };
    lse_lane<X> st;
    st.r = X::fits((double)zb) ? X::ref(zb) : -(A)INFINITY; /* else lse_slow decides */
    st.s = (A)0;
    st.huge = 0;
    if constexpr (TOP) {
        top->v = -INFINITY;
        top->i = -1;
    }
    const int64_t nv = a.V / N;
    for (int64_t q0 = 0; q0 < nv; q0 += 32 * kRowPasses) { /* each lane's vectors in order q */
        zvec<E> x[kRowPasses];
        load_passes(x, zr, q0, nv, lane);
#pragma unroll
        for (int p = 0; p < kRowPasses; ++p) {
            const int64_t q = q0 + 32 * p + lane;
            if (q < nv) {
                const zrow_batch<DT> bt{x[p]};
                lse_add<X>(st, bt);
                if constexpr (TOP) {
#pragma unroll
                    for (int j = 0; j < N; ++j) top->see(bt.at(j), q * N + j);
                }
            }
        }
    }
    if (nv * N + lane < a.V) {
        zbatch<A, 1> bt;
        bt.v[0] = zrow_value<DT>(zr[nv * N + lane]);
        lse_add<X>(st, bt);
        if constexpr (TOP) top->see(bt.v[0], nv * N + lane);
    }
    if constexpr (TOP) top->join();
    *huge = X::MAY_OVERFLOW ? __any_sync(0xffffffffu, st.huge) : 0;
    return lse_group<X, 32>(st, 0xffffffffu);
}

/* The log-sum-exp over the V token outputs of a node whose h is row (its column H + 1 holding
 * -c / fwd_unit, fwd_keys), from the products themselves (fwd_dot, one at a time, float64
 * sums), c added back: for a row whose values left the dtype's range (float16: |z - c| > 1.6e7).
 * Every lane gets it. */
template <int DT>
__device__ __noinline__ double fwd_lse_exact(const joint_args &a, const typename tdt_elem<DT>::T *row,
                                             const typename tdt_elem<DT>::T *wp, int64_t ldh, double c, int lane) {
    double m = -INFINITY, s = 0.0;
    for (int64_t o = 0; o < a.V; ++o) {
        const double v = fwd_dot<DT>(row, wp, ldh, o, lane);
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
        } else {
            s += exp(v - m);
        }
    }
    return c + m + log(s);
}

/* Warp w of block j: node first + 8 j + w's block of the workspace from its row of z (pitch
 * ldz, the dtype; the product added the bias), as joint_fwd_kernel writes it: the log-normaliser
 * over the V token values by the unfused normaliser's online log-sum-exp (row_lse), each lane
 * kRowPasses 16-byte vectors in flight, in the fast units (base 2 but for float64), again in
 * natural units for a row with a value beyond what those hold (tdt_rexp2::fits: |value| > 1e7).
 * float16 and bfloat16 (fwd_shifted): the row holds z + bias - c, and the block the node's exact
 * logits and c (fwd_keys; the h kernel's hs and W padded wp, pitch ldh, for a row past the
 * dtype's range). */
template <int DT>
__global__ void __launch_bounds__(256) gemm_node_kernel(const __grid_constant__ joint_args a, int64_t first,
                                                        int64_t limit, const typename tdt_elem<DT>::T *z, int64_t ldz,
                                                        const typename tdt_elem<DT>::T *hs,
                                                        const typename tdt_elem<DT>::T *wp, int64_t ldh) {
    typedef acc_t<DT> A;
    typedef typename tdt_rexp_fast<DT>::X X;
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    node_info ni;
    int64_t Tb, Ub;
    node_decode(a, first + j, limit, &ni, &Tb, &Ub);
    if (!ni.valid) return; /* warp-uniform */
    const typename tdt_elem<DT>::T *zr = z + j * ldz;
    int huge;
    if constexpr (fwd_shifted<DT>()) {
        double *const w = tdt_wblock(&a.wb, ni.b, ni.t, ni.u);
        const double c = w[tdt_w_lse(a.D)], zb = w[TDT_W_BLANK], zy = w[TDT_W_LABEL];
        const A ref = (A)(zb - c);
        row_top top;
        double lse = row_lse<DT, X, true>(a, zr, ref, lane, &huge, &top);
        if (huge) lse = row_lse<DT, tdt_rexp_nat<DT>, false>(a, zr, ref, lane, &huge, NULL); /* rare */
        /* the largest term exact: its value's rounding to the dtype taken out of the sum */
        if (top.i >= 0 && fabs(lse) < INFINITY) {
            const double ze = fwd_dot<DT>(hs + j * ldh, wp, ldh, top.i, lane); /* z - c */
            lse += log1p(exp((double)top.v - lse) * expm1(ze - (double)top.v));
        }
        lse += c;
        if (!(fabs(lse) < INFINITY)) lse = fwd_lse_exact<DT>(a, hs + j * ldh, wp, ldh, c, lane); /* rarer */
        if (lane != 0) return;
        node_block<double>(a, ni, lse, zb, zy, w + TDT_W_DUR);
    } else {
        (void)hs;
        (void)wp;
        double lse = row_lse<DT, X, false>(a, zr, zr[a.blank], lane, &huge, NULL);
        if (huge) lse = row_lse<DT, tdt_rexp_nat<DT>, false>(a, zr, zr[a.blank], lane, &huge, NULL); /* rare */
        if (lane != 0) return;
        node_block<A>(a, ni, lse, zr[a.blank], ni.has_label && ni.y >= 0 ? zr[ni.y] : (A)0, zr + a.V);
    }
}

/* Warp w of block j: node first + 8 j + w's block of the workspace from its log-normaliser
 * lse_in[8 j + w] (float32, tdt_gpu_wgmma_lse: float16 and bfloat16 on sm_90a) and the blank,
 * label and duration logits the h kernel put in the block (fwd_keys); a log-normaliser that
 * float32 did not hold (inf or NaN) is recomputed from the products themselves
 * (fwd_lse_exact). */
template <int DT>
__global__ void __launch_bounds__(256) gemm_node_lse_kernel(const __grid_constant__ joint_args a, int64_t first,
                                                            int64_t limit, const float *lse_in,
                                                            const typename tdt_elem<DT>::T *hs,
                                                            const typename tdt_elem<DT>::T *wp, int64_t ldh) {
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    node_info ni;
    int64_t Tb, Ub;
    node_decode(a, first + j, limit, &ni, &Tb, &Ub);
    if (!ni.valid) return; /* warp-uniform */
    double *const w = tdt_wblock(&a.wb, ni.b, ni.t, ni.u);
    const double c = w[tdt_w_lse(a.D)], zb = w[TDT_W_BLANK], zy = w[TDT_W_LABEL];
    double lse = (double)lse_in[j];
    if (!(fabs(lse) < INFINITY)) lse = fwd_lse_exact<DT>(a, hs + j * ldh, wp, ldh, c, lane); /* rare */
    if (lane != 0) return;
    node_block<double>(a, ni, lse, zb, zy, w + TDT_W_DUR);
}

/* The bulk of a row of dz from the row d of nv 16-byte vectors (the dtype): every value x as
 * tdt_row_grad(c, x), each lane kRowPasses vectors read before it hands them on (loads in flight
 * together) to put(q, vector q): written back over d, or as split parts. No branch an element:
 * the outputs the bulk formula does not give are written over afterwards. */
template <int DT, typename X, typename Put>
__device__ __forceinline__ void dz_stream(const typename tdt_elem<DT>::T *d, int64_t nv, const row_coef<X> &c, int lane,
                                          const Put &put) {
    typedef typename tdt_elem<DT>::T E;
    enum { N = zvec<E>::N };
    for (int64_t q0 = 0; q0 < nv; q0 += 32 * kRowPasses) { /* warp-uniform */
        zvec<E> x[kRowPasses];
        load_passes(x, d, q0, nv, lane);
#pragma unroll
        for (int p = 0; p < kRowPasses; ++p) {
            const int64_t q = q0 + 32 * p + lane;
            if (q < nv) {
#pragma unroll
                for (int e = 0; e < N; ++e)
                    x[p].v[e] = tdt_elem<DT>::from_acc(tdt_row_grad(c, tdt_elem<DT>::to_acc(x[p].v[e])));
                put(q, x[p]);
            }
        }
    }
}

/* A backward node's coefficients for its row of dz (gemm_coef_kernel, from node_setup_bwd):
 * whether it is taken, its label (-1: none), its lse, tok_occ and upstream gradient for the
 * bulk of the row, and the dz of its blank, its label and its D durations (node_dz_known, float64).
 * Set up by a thread a node before the dz kernel, so that the dz kernel's warps only stream. */
struct dz_coef {
    double lse, tok_occ, gb;
    int32_t valid, y;
    double known[2 + TDT_MAX_DURATIONS];
};
static_assert(sizeof(dz_coef) <= TDT_JOINT_COEF_BYTES, "joint_plan.h sizes g_coef by TDT_JOINT_COEF_BYTES");

/* node ni's dz_coef from its coefficients nc (node_setup_bwd) into c */
__device__ __forceinline__ void dz_coef_of(const joint_args &a, const node_info &ni, const node_coef &nc, dz_coef &c) {
    c.valid = ni.valid;
    c.y = ni.y;
    if (!ni.valid) return;
    c.lse = nc.lse;
    c.tok_occ = nc.g.tok_occ;
    c.gb = nc.gb;
    c.known[0] = node_dz_known(a, ni, nc, a.blank);
    c.known[1] = ni.y >= 0 ? node_dz_known(a, ni, nc, ni.y) : 0.0;
    for (int k = 0; k < a.D; ++k) c.known[2 + k] = node_dz_known(a, ni, nc, a.V + k);
}

/* Thread j (j < count): the chunk's node j (chunk_node)'s dz_coef into coef[j]; where wrow is
 * not NULL (the backward's dz on wgmma), also the bulk's coefficients in base 2 into wrow[j] as
 * dz_stream would take them (valid only where lse may be a base-2 reference: the other rows are
 * gemm_dz_fix_kernel's, flagged rare). CHIP (TDT_GPU_JOINT_BWD=chip, no coef): wrow[j], the
 * node's known values as float32 into kn[j (2 + D) + i] (dz_coef.known's, for a valid row) and
 * its rare row counted in *nrare (chip_rare_kernel's). */
template <bool CHIP>
__global__ void __launch_bounds__(64) gemm_coef_kernel(const __grid_constant__ joint_args a, int64_t first,
                                                       int64_t limit, int64_t count, dz_coef *coef,
                                                       tdt_wgmma_dz_row *wrow, float *kn, int *nrare) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= count) return;
    int64_t lim;
    const int64_t n = chunk_node(a, first, limit, j, &lim);
    node_info ni;
    node_coef nc;
    node_setup_bwd(a, n, lim, &ni, &nc);
    dz_coef local;
    dz_coef &c = CHIP ? local : coef[j];
    dz_coef_of(a, ni, nc, c);
    if (!wrow) return;
    const bool fits = ni.valid && tdt_rexp2::fits(nc.lse);
    tdt_wgmma_dz_row w = {0.f, 0.f, 0.f, 0.f, 0, ni.y, ni.valid && !fits, 0};
    if (fits) {
        double fix;
        w.ref = tdt_rexp2::ref_fix(nc.lse, &fix);
        w.occ = (float)(nc.g.tok_occ * fix);
        w.cl = a.clamp > 0.0 ? (float)a.clamp : INFINITY;
        w.scale = (float)nc.gb;
        w.valid = 1;
    }
    wrow[j] = w;
    if (!CHIP) return;
    if (fits)
        for (int i = 0; i < 2 + a.D; ++i) kn[j * (2 + a.D) + i] = (float)c.known[i];
    if (w.rare) atomicAdd(nrare, 1);
}

/* The values of a node's row of dz that its coefficients c hold (float64): the blank, the label,
 * the D durations, then zeros from O to ldz, through put1, the warp's lanes in turn. */
template <int DT, typename Put1>
__device__ __forceinline__ void dz_known(const joint_args &a, const dz_coef &c, int64_t ldz, int lane,
                                         const Put1 &put1) {
    typedef acc_t<DT> A;
    /* entry i: the blank, the label (none: -1), the D durations, then O .. ldz - 1 */
    const int64_t fix_n = 2 + a.D + (ldz - a.O);
    for (int64_t i = lane; i < fix_n; i += 32) {
        const int64_t o = i == 0 ? a.blank : i == 1 ? c.y : i < 2 + a.D ? a.V + (i - 2) : a.O + (i - 2 - a.D);
        if (o >= 0) put1(o, i < 2 + a.D ? (A)c.known[i] : (A)0);
    }
}

/* A node's row of dz from dr, its row of the backward's z product, and its coefficients c: the
 * bulk (dz_stream, from the reference: 0 where lp_shift, else lse), then, after a __syncwarp that
 * orders the two writes of those values, the blank, the label and the durations (c's float64
 * values) and zeros from O to ldz, through put (vectors) and put1 (single values). */
template <int DT, typename Put, typename Put1>
__device__ __forceinline__ void dz_row(const joint_args &a, const dz_coef &c, const typename tdt_elem<DT>::T *dr,
                                       int64_t ldz, int lane, const Put &put, const Put1 &put1) {
    typedef acc_t<DT> A;
    typedef typename tdt_rexp_fast<DT>::X XF;
    typedef tdt_rexp_nat<DT> XN;
    const int64_t nv = ldz / zvec<typename tdt_elem<DT>::T>::N; /* ldz: a multiple of 8 */
    const double lse = c.lse, ref = lp_shift<DT>(lse) ? 0.0 : lse, occ = c.tok_occ, gb = c.gb;
    const A cl = a.clamp > 0.0 ? (A)a.clamp : (A)INFINITY;
    if (XF::fits(ref)) /* false for NaN */
        dz_stream<DT>(dr, nv, tdt_row_coef<XF>(ref, occ, cl, gb), lane, put);
    else
        dz_stream<DT>(dr, nv, tdt_row_coef<XN>(ref, occ, cl, gb), lane, put);
    __syncwarp();
    dz_known<DT>(a, c, ldz, lane, put1);
}

/* Warp w of block j (j < count): the chunk's node 8 j + w's dz from its row of the backward's z
 * product (pitch ldz, the dtype: the node's logits, bias included, less lse where lp_shift) and
 * its coefficients coef[8 j + w] (gemm_coef_kernel), written over the row: zero from O on, for
 * nodes outside a feasible lattice and past limit. The token values as the unfused gradient's rows
 * (dz_stream: gpu_common.cuh's tdt_row_grad, base 2 where the reference fits: 0 for
 * log-probabilities, else lse); then, over those, the blank, the label and the durations in float64
 * (dz_row). SPLIT (split products, float32): dz goes straight into its three bfloat16 parts, row j
 * of the matrices split, split + split_stride, split + 2 split_stride (pitch ldz), and z's row is
 * left as it is, but for a row with a value that is not finite: its parts are zeros (an infinity's
 * products with other operands' zero parts would be NaN where float32's are infinite), its dz is
 * written over z's row in float32, nf[1 + j] flags it and nf[0] counts it, for split_fix_dw_kernel
 * and split_fix_dh_kernel. */
template <int DT, bool SPLIT>
__global__ void __launch_bounds__(256) gemm_dz_kernel(const __grid_constant__ joint_args a, const dz_coef *coef,
                                                      int64_t count, typename tdt_elem<DT>::T *d, int64_t ldz,
                                                      uint16_t *split, int64_t split_stride, int *nf) {
    static_assert(!SPLIT || DT == TDT_DTYPE_FLOAT32, "split products are float32's");
    typedef acc_t<DT> A;
    typedef typename tdt_elem<DT>::T E;
    enum { N = zvec<E>::N };
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (j >= count) return; /* warp-uniform */
    const dz_coef &c = coef[j];
    E *const dr = d + j * ldz;
    uint16_t *const sr = SPLIT ? split + j * ldz : NULL;
    const int64_t nv = ldz / N; /* ldz: a multiple of 8 */
    const auto in_place = [&](int64_t q, const zvec<E> &x) { x.store(dr + q * N); };
    const auto in_place1 = [&](int64_t o, A v) { dr[o] = tdt_elem<DT>::from_acc(v); };
    bool bad = false; /* SPLIT: this lane has written a value that is not finite */
    const auto parts = [&](int64_t q, const zvec<E> &x) {
        if constexpr (SPLIT) {
#pragma unroll
            for (int e = 0; e < N; ++e) bad |= !isfinite(x.v[e]);
            store_parts<3, part_self>(sr, split_stride, q * N, x.v);
        }
    };
    const auto parts1 = [&](int64_t o, A v) {
        uint16_t p[3];
        bad |= !isfinite(v);
        tdt_split3((float)v, p);
        for (int i = 0; i < 3; ++i) sr[i * split_stride + o] = p[i];
    };
    const auto zeros = [&]() {
        zvec<E> zero;
#pragma unroll
        for (int e = 0; e < N; ++e) zero.v[e] = tdt_elem<DT>::from_acc((A)0);
        return zero;
    };
    if (!c.valid) { /* warp-uniform */
        const zvec<E> zero = zeros();
        for (int64_t q = lane; q < nv; q += 32) {
            if (SPLIT) parts(q, zero);
            else in_place(q, zero);
        }
        if (SPLIT && lane == 0) nf[1 + j] = 0;
        return;
    }
    if (!SPLIT) {
        dz_row<DT>(a, c, dr, ldz, lane, in_place, in_place1);
        return;
    }
    dz_row<DT>(a, c, dr, ldz, lane, parts, parts1);
    const bool row_bad = __any_sync(0xffffffffu, bad);
    if (lane == 0) {
        nf[1 + j] = row_bad;
        if (row_bad) atomicAdd(nf, 1);
    }
    if (!row_bad) return; /* warp-uniform */
    __syncwarp(); /* the parts' writes above, then the zeros over them */
    for (int64_t q = lane; q < nv; q += 32) parts(q, zeros());
    dz_row<DT>(a, c, dr, ldz, lane, in_place, in_place1);
}

/* The backward's dz on wgmma (tdt_gpu_wgmma_dz has written the first V values of each row from
 * wrow's coefficients): warp w of block j (j < count) completes node 8 j + w's row (pitch ldz)
 * as gemm_dz_kernel would have it: zeros from V on where the node is not taken; where its lse
 * may be a base-2 reference, the blank, the label, the durations and the zero padding
 * (dz_known); elsewhere (|lse| > 1e7: the rows wrow left as zeros) the whole row from its
 * products one output at a time (fwd_dot against W padded, as the z product has them: h's row,
 * pitch ldh, carries -lse where lp_shift), then dz_row over them. Rare: a warp's ldz dot products. */
template <int DT>
__global__ void __launch_bounds__(256) gemm_dz_fix_kernel(const __grid_constant__ joint_args a, const dz_coef *coef,
                                                          int64_t count, const typename tdt_elem<DT>::T *hs,
                                                          int64_t ldh, const typename tdt_elem<DT>::T *wp,
                                                          typename tdt_elem<DT>::T *d, int64_t ldz) {
    typedef acc_t<DT> A;
    typedef typename tdt_elem<DT>::T E;
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (j >= count) return; /* warp-uniform */
    const dz_coef &c = coef[j];
    E *const dr = d + j * ldz;
    const auto in_place1 = [&](int64_t o, A v) { dr[o] = tdt_elem<DT>::from_acc(v); };
    if (!c.valid) { /* warp-uniform */
        for (int64_t o = a.V + lane; o < ldz; o += 32) in_place1(o, (A)0);
        return;
    }
    if (tdt_rexp2::fits(c.lse)) {
        dz_known<DT>(a, c, ldz, lane, in_place1);
        return;
    }
    for (int64_t o = 0; o < ldz; ++o) {
        const float v = fwd_dot<DT>(hs + j * ldh, wp, ldh, o, lane);
        if (lane == 0) in_place1(o, (A)v);
    }
    __syncwarp();
    const auto in_place = [&](int64_t q, const zvec<E> &x) { x.store(dr + q * zvec<E>::N); };
    dz_row<DT>(a, c, dr, ldz, lane, in_place, in_place1);
}

/* The chip backward's rare rows (TDT_GPU_JOINT_BWD=chip): the chunk's nodes whose log-normaliser
 * is past the base-2 reference's range (gemm_coef_kernel<true> flagged them in wrow and counted
 * them in *nrare; the chip's kernels took their rows as zeros), one at a time in node order by
 * one block of 256 threads, as gemm_dz_fix_kernel has them: the node's row of z (h's row in hs,
 * pitch ldh, or h packed where pack_kc > 0: chip_h_at; against W's rows, float32 sums, plus the
 * bias, less lse where lp_shift) in the dtype into zr (ldz values), dz_row over it, then where
 * not NULL d h's row into dx (float32, pitch H, written) and the row's terms of d W and d bias
 * into wacc (pitch ldw, added). Nothing where *nrare is 0, which it is again after. */
template <int DT>
__global__ void __launch_bounds__(256) chip_rare_kernel(const __grid_constant__ joint_args a, int64_t first,
                                                        int64_t limit, int64_t count, const tdt_wgmma_dz_row *wrow,
                                                        int *nrare, const typename tdt_elem<DT>::T *hs, int64_t ldh,
                                                        typename tdt_elem<DT>::T *zr, int64_t ldz, float *dx,
                                                        float *wacc, int64_t ldw, int pack_kc) {
    typedef tdt_elem<DT> TE;
    typedef typename TE::T E;
    typedef acc_t<DT> A;
    __shared__ int flag[256];
    __shared__ dz_coef c;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int any = *nrare;
    __syncthreads(); /* every thread has read it before thread 0 clears it */
    if (any == 0) return;
    const E *const W = static_cast<const E *>(a.W);
    const E *const bias = static_cast<const E *>(a.bias);
    for (int64_t base = 0; base < count; base += 256) {
        const int f = base + tid < count && wrow[base + tid].rare;
        flag[tid] = f;
        if (!__syncthreads_or(f)) continue;
        for (int i = 0; i < 256; ++i) {
            if (!flag[i]) continue; /* block-uniform */
            const int64_t j = base + i;
            const auto hat = [&](int64_t k) {
                return TE::to_acc(hs[pack_kc > 0 ? chip_h_at(j, k, pack_kc) : j * ldh + k]);
            };
            if (tid == 0) {
                int64_t lim;
                const int64_t n = chunk_node(a, first, limit, j, &lim);
                node_info ni;
                node_coef nc;
                node_setup_bwd(a, n, lim, &ni, &nc);
                dz_coef_of(a, ni, nc, c);
            }
            __syncthreads();
            for (int64_t o = warp; o < ldz; o += 8) { /* zeros from O on */
                float v = 0.f;
                for (int64_t k = lane; k < a.H && o < a.O; k += 32)
                    v = fmaf(hat(k), TE::to_acc(W[o * a.W_s + k]), v);
                for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
                if (lane == 0 && o >= a.O) zr[o] = TE::from_double(0.0);
                else if (lane == 0) {
                    double x = (double)v + (bias ? (double)TE::to_acc(bias[o]) : 0.0);
                    if (lp_shift<DT>(c.lse)) x -= c.lse;
                    zr[o] = TE::from_double(x);
                }
            }
            __syncthreads();
            if (warp == 0) {
                const auto put = [&](int64_t q, const zvec<E> &x) { x.store(zr + q * zvec<E>::N); };
                const auto put1 = [&](int64_t o, A v) { zr[o] = TE::from_acc(v); };
                dz_row<DT>(a, c, zr, ldz, lane, put, put1);
            }
            __syncthreads();
            if (dx)
                for (int64_t k = tid; k < a.H; k += 256) {
                    float v = 0.f;
                    for (int64_t o = 0; o < a.O; ++o) v = fmaf(TE::to_acc(zr[o]), TE::to_acc(W[o * a.W_s + k]), v);
                    dx[j * a.H + k] = v;
                }
            if (wacc)
                for (int64_t e = tid; e < a.O * (a.H + 1); e += 256) {
                    const int64_t o = e / (a.H + 1), k = e - o * (a.H + 1);
                    wacc[o * ldw + k] += TE::to_acc(zr[o]) * (k < a.H ? hat(k) : 1.f);
                }
            __syncthreads(); /* zr and c, before the next row's */
        }
        __syncthreads(); /* flag, before the next rows' */
    }
    if (tid == 0) *nrare = 0;
}

/* W into wp in the dtype, rows of pitch ldwp: W's row, the bias (zero without one), lse_unit in
 * the TDT_JOINT_LSE_PARTS columns after it (against h's -lse), zeros after those; zero rows from
 * O to ldz. */
template <int DT>
__device__ __forceinline__ typename tdt_elem<DT>::T wpad_value(const joint_args &a, int64_t o, int64_t k) {
    typedef typename tdt_elem<DT>::T E;
    const E zero = tdt_elem<DT>::from_acc((acc_t<DT>)0);
    if (o >= a.O) return zero;
    if (k < a.H) return static_cast<const E *>(a.W)[o * a.W_s + k];
    if (k == a.H) return a.bias ? static_cast<const E *>(a.bias)[o] : zero;
    return k <= a.H + TDT_JOINT_LSE_PARTS ? tdt_elem<DT>::from_double(lse_unit<DT>()) : zero;
}

template <int DT>
__global__ void gemm_wpad_kernel(const __grid_constant__ joint_args a, typename tdt_elem<DT>::T *wp, int64_t ldwp,
                                 int64_t ldz) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < ldz * ldwp;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / ldwp;
        wp[i] = wpad_value<DT>(a, o, i - o * ldwp);
    }
}

/* Split products (float32): W padded as gemm_wpad_kernel has it, as its bfloat16 parts in the
 * blocks of ldh values that joint_plan.h gives them (rows of TDT_JOINT_SPLIT_BLOCKS ldh), four
 * columns a thread. */
__global__ void gemm_wsplit_kernel(const __grid_constant__ joint_args a, uint16_t *wp, int64_t ldh, int64_t ldz) {
    const int64_t quads = ldh / 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < ldz * quads;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / quads, k0 = (i - o * quads) * 4;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = wpad_value<TDT_DTYPE_FLOAT32>(a, o, k0 + e);
        store_parts<TDT_JOINT_SPLIT_BLOCKS, w_part_of>(wp + o * TDT_JOINT_SPLIT_BLOCKS * ldh, ldh, k0, v);
    }
}

/* Split products: the chunk's dz rows flagged by gemm_dz_kernel (nf[0] of them; nothing to do for
 * none) went into the d W product as zeros; their terms are added here in float32, rows
 * ascending, as float32's kernels have them (infinities included): d W and d bias (rows
 * [r0, r0 + nr) of d W's column-major ldz columns, pitch ldw) += dz[n]^T h[n], h from its three
 * parts (block 0, 3 and 5 of its row, joint_plan.h). */
__global__ void split_fix_dw_kernel(const int *nf, int64_t rows, const float *dz, int64_t ldz, const uint16_t *hs,
                                    int64_t ldh, float *wacc, int64_t ldw, int64_t r0, int64_t nr, int64_t O) {
    if (nf[0] == 0) return;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < O * nr; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / nr, k = r0 + (i - o * nr);
        float s = 0.0f;
        for (int64_t n = 0; n < rows; ++n) {
            if (!nf[1 + n]) continue;
            const uint16_t *hr = hs + n * TDT_JOINT_SPLIT_BLOCKS * ldh + k;
            const float h =
                tdt_bf16_to_float(hr[0]) + tdt_bf16_to_float(hr[3 * ldh]) + tdt_bf16_to_float(hr[5 * ldh]);
            s += dz[n * ldz + o] * h;
        }
        wacc[o * ldw + k] += s;
    }
}

/* Split products: d h of the chunk's flagged dz rows (zeros from the d h product) in float32,
 * over W padded's rows ascending: d h[n] = dz[n] W. */
__global__ void split_fix_dh_kernel(const __grid_constant__ joint_args a, const int *nf, int64_t rows, const float *dz,
                                    int64_t ldz, float *dx) {
    if (nf[0] == 0) return;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * a.H;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / a.H, k = i - n * a.H;
        if (!nf[1 + n]) continue;
        float s = 0.0f;
        for (int64_t o = 0; o < a.O; ++o) s += dz[n * ldz + o] * wpad_value<TDT_DTYPE_FLOAT32>(a, o, k);
        dx[i] = s;
    }
}

/* Warp w of block i: the chunk's node j's d(enc + pred) = d h * the dropout's factor * act' (j =
 * 8 i + w < count; chunk_node: node first + j, or the compacted chunk's kept node j), in place
 * over row j of dx (pitch H); zero outside a feasible lattice. */
template <int DT>
__global__ void __launch_bounds__(256) gemm_dx_kernel(const __grid_constant__ joint_args a, int64_t first,
                                                      int64_t limit, int64_t count, acc_t<DT> *dx) {
    typedef acc_t<DT> A;
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (j >= count) return; /* warp-uniform */
    node_info ni; /* every lane decodes the node: the same loads */
    int64_t lim;
    const int64_t n = chunk_node(a, first, limit, j, &lim);
    const int take = node_bwd(a, n, lim, &ni);
    A *const row = dx + j * a.H;
    if (!take) { /* warp-uniform */
        for (int64_t k = lane; k < a.H; k += 32) row[k] = (A)0;
        return;
    }
    /* 16 bytes of d h a load where the rows allow it: node_dx's values */
    enum { M = 16 / (int)sizeof(A) };
    const typename tdt_elem<DT>::T *er, *pr;
    if (hidden_rows<DT, M>(a, ni, &er, &pr) && a.H % M == 0) {
        for (int64_t k0 = (int64_t)lane * M; k0 < a.H; k0 += 32 * M) {
            hidden_vals<DT, M> hv;
            hv.load(a, ni, er, pr, k0);
            zvec<A> d;
            d.load(row + k0);
#pragma unroll
            for (int i = 0; i < M; ++i) d.v[i] = hidden_dx(a.act, d.v[i], hv.x[i], hv.keep[i]);
            d.store(row + k0);
        }
        return;
    }
    for (int64_t k = lane; k < a.H; k += 32) row[k] = node_dx<DT>(a, ni, k, row[k]);
}

/* skip_below's compaction (the backward's chunks of kept nodes). Whether node n of the padded
 * order enters the backward: in a feasible lattice and not left out (node_setup_bwd's rule). */
__device__ __forceinline__ bool node_kept(const joint_args &a, int64_t n) {
    node_info ni;
    node_coef nc;
    node_setup_bwd(a, n, n + 1, &ni, &nc);
    return ni.valid != 0;
}

/* Warp w of block i: (b, t) row r = 8 i + w (r < rows). SCATTER 0: its number of kept nodes
 * into krow[r] (and krow[rows] = 0, for the exclusive sum after). SCATTER 1 (krow now holds
 * where each row's kept nodes start): their numbers into kidx, ascending. */
template <bool SCATTER>
__global__ void __launch_bounds__(256) keep_rows_kernel(const __grid_constant__ joint_args a, int64_t rows,
                                                        int32_t *krow, int32_t *kidx) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (!SCATTER && r == 0 && lane == 0) krow[rows] = 0;
    if (r >= rows) return; /* warp-uniform */
    int32_t at = SCATTER ? krow[r] : 0;
    for (int64_t u0 = 0; u0 < a.row; u0 += 32) {
        const int64_t n = r * a.row + u0 + lane;
        const bool keep = u0 + lane < a.row && node_kept(a, n);
        const unsigned mask = __ballot_sync(0xffffffffu, keep);
        if (SCATTER && keep) kidx[at + __popc(mask & ((1u << lane) - 1u))] = (int32_t)n;
        at += __popc(mask);
    }
    if (!SCATTER && lane == 0) krow[r] = at;
}

/* The inclusive prefix sum of v over the warp's lanes. */
__device__ __forceinline__ int32_t warp_inclusive_sum(int32_t v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    return v;
}

/* The exclusive prefix sum of x[0, n) in place, by one block of 1024 threads, 1024 values at a
 * time. */
__global__ void __launch_bounds__(1024) keep_scan_kernel(int32_t *x, int64_t n) {
    __shared__ int32_t warp_sum[32], tile_sum;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int32_t carry = 0;
    for (int64_t base = 0; base < n; base += 1024) {
        const int64_t i = base + threadIdx.x;
        const int32_t v = i < n ? x[i] : 0;
        const int32_t inc = warp_inclusive_sum(v, lane);
        if (lane == 31) warp_sum[w] = inc;
        __syncthreads();
        if (w == 0) { /* the warps' sums into their exclusive sum, and the 1024 values' sum */
            const int32_t ws = warp_sum[lane], wi = warp_inclusive_sum(ws, lane);
            warp_sum[lane] = wi - ws;
            if (lane == 31) tile_sum = wi;
        }
        __syncthreads();
        if (i < n) x[i] = carry + warp_sum[w] + inc - v;
        carry += tile_sum;
        __syncthreads(); /* warp_sum and tile_sum read before the next values overwrite them */
    }
}

/* Compacted chunk k of nchunks into desc: its rows [r0, r1) are those whose kept nodes start in
 * [k step, (k + 1) step) of the kept list (the last chunk's run to rows), so that it holds fewer
 * than step + U + 1 kept nodes; then where they start and end in kidx. krow: rows + 1 entries,
 * ascending. One thread. */
__global__ void keep_chunk_kernel(const int32_t *krow, int64_t rows, int64_t k, int64_t nchunks, int64_t step,
                                  int64_t *desc) {
    const auto first_at = [&](int64_t v) { /* the first r <= rows with krow[r] >= v, else rows */
        int64_t lo = 0, hi = rows;
        while (lo < hi) {
            const int64_t mid = (lo + hi) >> 1;
            if (krow[mid] < v) lo = mid + 1;
            else hi = mid;
        }
        return lo;
    };
    const int64_t r0 = first_at(k * step), r1 = k + 1 == nchunks ? rows : first_at((k + 1) * step);
    desc[0] = r0;
    desc[1] = r1;
    desc[2] = krow[r0];
    desc[3] = krow[r1];
}

/* ---- host ------------------------------------------------------------------------------------ */

/* Split products, d h: the six pairs (i, j) of dz's part i and W's part j (block j of its rows)
 * with i + j < 3, smallest first. */
const int kSplitTerms = 6;
const int kSplitTerm[kSplitTerms][2] = {{2, 0}, {1, 1}, {0, 2}, {1, 0}, {0, 1}, {0, 0}};

template <int DT> struct gemm_run {
    typedef acc_t<DT> A;
    typedef typename tdt_elem<DT>::T E;
    const tdt_joint_call_t *call;
    const tdt_gpu_joint_plan_t &plan;
    joint_args a;
    cudaStream_t stream;
    int num_sms;
    cublasLtHandle_t h;
    char *s;  /* the scratch */
    int pick;  /* the products' kernels: TDT_LT_FIRST, TDT_LT_FEWEST_WAVES or TDT_LT_BY_PRODUCT */
    int wgmma; /* TDT_GPU_JOINT_FWD=wgmma (the default) */
    int device;
    int wgmma_b; /* TDT_GPU_JOINT_BWD: 1 wgmma, 2 chip (the chip backward, with the plan's chip layout) */
    bool chip_wp = false; /* W padded in the chip layout's area (its forward) */
    int z_pick() const { return pick == TDT_LT_BY_PRODUCT ? TDT_LT_FIRST : pick; }
    int dw_dh_pick() const { return pick == TDT_LT_BY_PRODUCT ? TDT_LT_FEWEST_WAVES : pick; }

    A *z() const { return reinterpret_cast<A *>(s + plan.g_z); }
    E *hs() const { return reinterpret_cast<E *>(s + plan.g_h); }
    /* split products (float32): h's parts, or NULL; dz's three parts (matrices of N_b x ldz) */
    bool split() const { return DT == TDT_DTYPE_FLOAT32 && plan.g_split; }
    uint16_t *hsplit() const { return split() ? reinterpret_cast<uint16_t *>(s + plan.g_h) : NULL; }
    /* split products, the backward: h's parts 2, 1, 0 as three matrices of N_b x ldh after those
     * rows (the d W products' operand: [h2; h1; h0] against dz's parts [dz0; dz1; dz2]) */
    uint16_t *hstacked() const { return split() ? hsplit() + nodes(true) * plan.g_ldhp : NULL; }
    uint16_t *dzsplit() const {
        return split() ? reinterpret_cast<uint16_t *>(s + plan.g_z + (size_t)(nodes(true) * plan.g_ldz) * sizeof(A))
                       : NULL;
    }
    int *nf() const { return split() ? reinterpret_cast<int *>(s + plan.g_nf) : NULL; }
    /* the products' operand type and inner pitch of h and W */
    cudaDataType_t opnd() const { return split() ? CUDA_R_16BF : lt_types<DT>::ab; }
    E *wp() const { return reinterpret_cast<E *>(s + (chip_wp ? plan.c_area : plan.g_wp)); }
    void *ws() const { return s + plan.g_lt; }
    /* a chunk's nodes: forward, backward (2/5 of the rows for float32 with split products) */
    int64_t nodes(bool backward) const { return (backward ? plan.g_rows_b : plan.g_rows) * a.row; }

    tdt_status_t cuda(cudaError_t e, const char *what) const {
        return e == cudaSuccess ? TDT_STATUS_SUCCESS : tdt_gpu_cuda_fail(e, what);
    }

    /* the backward chunk [first, limit)'s dz: its nodes' coefficients (gemm_coef_kernel), then
     * gemm_dz_kernel, split where split() */
    void launch_dz(const joint_args &ka, int64_t first, int64_t limit, E *dzw) const {
        const int64_t n = nodes(true);
        dz_coef *const coef = reinterpret_cast<dz_coef *>(s + plan.g_coef);
        gemm_coef_kernel<false><<<(unsigned)((n + 63) / 64), 64, 0, stream>>>(ka, first, limit, n, coef, NULL, NULL,
                                                                             NULL);
        const unsigned blocks = (unsigned)((n + 7) / 8);
        if constexpr (DT == TDT_DTYPE_FLOAT32) {
            if (split()) {
                gemm_dz_kernel<DT, true><<<blocks, 256, 0, stream>>>(ka, coef, n, dzw, plan.g_ldz, dzsplit(),
                                                                      n * plan.g_ldz, nf());
                return;
            }
        }
        gemm_dz_kernel<DT, false><<<blocks, 256, 0, stream>>>(ka, coef, n, dzw, plan.g_ldz, NULL, 0, NULL);
    }

    /* g_h and g_z for the chunk of rows [r0, r0 + rows) (a compacted chunk: ka.desc's) */
    tdt_status_t hz(const joint_args &ka, const lt_gemm &zg, int64_t r0, int64_t rows, int backward) const {
        const int64_t first = r0 * a.row, limit = (r0 + rows) * a.row, n = nodes(backward);
        gemm_h_kernel<DT><<<(unsigned)((n + 7) / 8), 256, 0, stream>>>(
            ka, first, limit, n, hs(), plan.g_ldh, backward, hsplit(), backward ? hstacked() : NULL, n * plan.g_ldh,
            wp(), 0);
        tdt_status_t st = cuda(cudaGetLastError(), "launching the joint's h kernel");
        if (st != TDT_STATUS_SUCCESS) return st;
        /* the forward writes (z - c) / fwd_unit (fwd_shifted; 256 for float16, else 1) */
        const A alpha = backward ? (A)1 : (A)(1.0 / lse_unit<DT>()), zero = 0;
        const cublasStatus_t c = zg.run(h, &alpha, wp(), hs(), &zero, z(), ws(), TDT_JOINT_LT_BYTES, stream);
        return c == CUBLAS_STATUS_SUCCESS ? TDT_STATUS_SUCCESS : lt_fail(c, "cublasLtMatmul (z = W h)");
    }

    /* W padded into wp: by the forward, and by a backward whose call has no forward (in a call
     * with both, the forward's copy is there: nothing else writes wp) */
    tdt_status_t pad_w() const {
        if (split())
            gemm_wsplit_kernel<<<flat_blocks(plan.g_ldz * plan.g_ldh / 4, num_sms), 256, 0, stream>>>(
                a, reinterpret_cast<uint16_t *>(wp()), plan.g_ldh, plan.g_ldz);
        else
            gemm_wpad_kernel<DT><<<flat_blocks(plan.g_ldz * plan.g_ldwp, num_sms), 256, 0, stream>>>(a, wp(), plan.g_ldwp,
                                                                                              plan.g_ldz);
        return cuda(cudaGetLastError(), "launching the joint's W kernel");
    }

    /* z + bias (ldz x N) = W padded (ldz x ldh) h (ldh x N), pitch ldz, in the dtype: in the
     * forward less the node's shift where fwd_shifted, in the backward (N_b nodes) less lse where
     * h carries it (float32 with split products: bfloat16 operands, float32 values) */
    tdt_status_t zgemm(lt_gemm *zg, bool backward) const {
        const cublasStatus_t c =
            zg->init(h, z_pick(), lt_types<DT>::compute, lt_types<DT>::scale, opnd(),
                     lt_types<DT>::ab, true, false, plan.g_ldz, nodes(backward),
                     plan.g_ldhp, wp(), plan.g_ldwp, hs(), plan.g_ldhp, z(), plan.g_ldz, TDT_JOINT_LT_BYTES);
        return c == CUBLAS_STATUS_SUCCESS ? TDT_STATUS_SUCCESS : lt_fail(c, "choosing cuBLASLt's kernel for z = W h");
    }

#if TDT_HAVE_WGMMA
    /* The forward on wgmma (TDT_GPU_JOINT_FWD=wgmma, float16 and bfloat16, where the device and
     * H suit it): z's bytes hold W packed, then as many (b, t) rows' h (pitch g_ldh) and
     * log-normalisers as fit (wgmma_rows; none: the cuBLASLt forward), and a chunk of those rows
     * at a time runs the h kernel, tdt_gpu_wgmma_lse and gemm_node_lse_kernel. Chunks of many
     * rows: the kernel's blocks take 128 nodes each, and z's chunk of rows would give it too few
     * blocks to fill the device. */
    /* Whether the wgmma kernels run on the device for this H (its attributes, kept by gpu.cu) */
    bool wgmma_device() const {
        int major = 0, minor = 0, optin = 0;
        return tdt_device_attribute(cudaDevAttrComputeCapabilityMajor, device, &major) == cudaSuccess &&
               tdt_device_attribute(cudaDevAttrComputeCapabilityMinor, device, &minor) == cudaSuccess &&
               tdt_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device, &optin) == cudaSuccess &&
               tdt_gpu_wgmma_fits(major, minor, optin, a.H);
    }
    int64_t wgmma_rows() const {
        if constexpr (!fwd_shifted<DT>()) return 0;
        if (!wgmma || !wgmma_device()) return 0;
        if (plan.c_chip) return plan.c_rows_f;
        const size_t room = (size_t)nodes(false) * (size_t)plan.g_ldz * sizeof(E),
                     pack = tdt_gpu_wgmma_pack_bytes(a.V, a.H),
                     per_row = (size_t)a.row * ((size_t)plan.g_ldh * sizeof(E) + sizeof(float));
        const int64_t all = a.B * a.maxT, fit = room > pack ? (int64_t)((room - pack) / per_row) : 0;
        return fit < all ? fit : all;
    }
    tdt_status_t forward_wgmma(int64_t step) const {
        /* the chip layout: W packed at c_wpk (from W itself), h and lse in the area after W padded */
        const bool chip = plan.c_chip;
        char *const zb = chip ? s + plan.c_wpk : reinterpret_cast<char *>(z());
        E *const h = reinterpret_cast<E *>(chip ? s + plan.c_area + plan.c_fwd_h
                                                : zb + tdt_gpu_wgmma_pack_bytes(a.V, a.H));
        float *const lse = chip ? reinterpret_cast<float *>(s + plan.c_area + plan.c_fwd_lse)
                                : reinterpret_cast<float *>(h + step * a.row * plan.g_ldh);
        tdt_status_t st = cuda(chip ? tdt_gpu_wgmma_pack(a.W, a.W_s, a.V, a.H, zb, num_sms, stream)
                                    : tdt_gpu_wgmma_pack(wp(), plan.g_ldwp, a.V, a.H, zb, num_sms, stream),
                               "launching the joint's W packing for wgmma");
        const int64_t all = a.B * a.maxT;
        for (int64_t r0 = 0; r0 < all && st == TDT_STATUS_SUCCESS; r0 += step) {
            const int64_t rows = all - r0 < step ? all - r0 : step;
            const int64_t first = r0 * a.row, limit = (r0 + rows) * a.row, count = rows * a.row;
            const unsigned blocks = (unsigned)((count + 7) / 8);
            gemm_h_kernel<DT><<<blocks, 256, 0, stream>>>(a, first, limit, count, h, plan.g_ldh, 0, NULL, NULL, 0,
                                                          wp(), 0);
            st = cuda(cudaGetLastError(), "launching the joint's h kernel");
            if (st == TDT_STATUS_SUCCESS)
                st = cuda(tdt_gpu_wgmma_lse(DT == TDT_DTYPE_FLOAT16, h, plan.g_ldh, zb, a.bias, a.V, a.H, count, lse,
                                            stream),
                          "launching the joint's wgmma log-normalisers");
            if (st != TDT_STATUS_SUCCESS) break;
            gemm_node_lse_kernel<DT><<<blocks, 256, 0, stream>>>(a, first, limit, lse, h, wp(), plan.g_ldh);
            st = cuda(cudaGetLastError(), "launching the joint's node kernel");
        }
        return st;
    }

    /* The backward's dz on wgmma (TDT_GPU_JOINT_BWD=wgmma; float16 and bfloat16 where the device
     * and H suit it, without skip_below, whose compacted chunks keep the cuBLASLt path): z's
     * bytes hold W packed, then dz for chunks of the (b, t) rows returned (at most the plan's
     * backward chunk; none: the cuBLASLt path). */
    int64_t wgmma_bwd_rows() const {
        if constexpr (!fwd_shifted<DT>()) return 0;
        if (wgmma_b != 1 || a.skip_below > 0.0 || !wgmma_device()) return 0;
        const size_t room = (size_t)nodes(false) * (size_t)plan.g_ldz * sizeof(E),
                     pack = tdt_gpu_wgmma_pack_bytes(a.V, a.H), per_row = (size_t)a.row * plan.g_ldz * sizeof(E);
        const int64_t fit = room > pack ? (int64_t)((room - pack) / per_row) : 0;
        return fit < plan.g_rows_b ? fit : plan.g_rows_b;
    }
    /* Whether the chip backward runs: TDT_GPU_JOINT_BWD=chip with the plan's chip layout, where
     * the wgmma kernels run and without skip_below */
    bool chip_backward() const {
        if constexpr (!fwd_shifted<DT>()) return false;
        return wgmma_b == 2 && plan.c_chip && !(a.skip_below > 0.0) && wgmma_device();
    }
    /* A chip chunk's parts (tdt_gpu_chip_chunk's offsets) */
    struct chip_parts {
        E *h;
        void *hp;
        tdt_wgmma_dz_row *wrow;
        float *kn;
        int *nrare;
        E *zr;
        float *dx;
    };
    /* A chip chunk of nb nodes from first: h (the h kernel: where dw packed, as
     * tdt_gpu_wgmma_pack packs W, into hp; else h's rows), the nodes' coefficients and known
     * values (gemm_coef_kernel<true>), then where dw d W and d bias (tdt_gpu_wgmma_dw, into wacc),
     * else d h (tdt_gpu_wgmma_dh, into dx), from z recomputed on the chip against W's O rows
     * packed at c_wpk, then the rare rows' terms (chip_rare_kernel). */
    tdt_status_t chip_chunk(const joint_args &ka, int64_t first, int64_t limit, int64_t nb, const chip_parts &cp,
                            bool dw, float *wacc, float *dx) const {
        if constexpr (fwd_shifted<DT>()) {
            const int kc = dw ? (int)((a.H + 63) / 64) : 0;
            E *const h = dw ? static_cast<E *>(cp.hp) : cp.h;
            const unsigned hb = (unsigned)(((dw ? (nb + 127) / 128 * 128 : nb) + 7) / 8); /* packed: whole tiles */
            if (dw)
                gemm_h_kernel<DT, true><<<hb, 256, 0, stream>>>(ka, first, limit, nb, h, plan.g_ldh, 1, NULL, NULL, 0,
                                                                NULL, kc);
            else
                gemm_h_kernel<DT><<<hb, 256, 0, stream>>>(ka, first, limit, nb, h, plan.g_ldh, 1, NULL, NULL, 0, NULL, 0);
            gemm_coef_kernel<true><<<(unsigned)((nb + 63) / 64), 64, 0, stream>>>(ka, first, limit, nb, NULL, cp.wrow,
                                                                                  cp.kn, cp.nrare);
            tdt_status_t st = cuda(cudaGetLastError(), "launching the joint's h and coefficient kernels");
            const int f16 = DT == TDT_DTYPE_FLOAT16, kp = 2 + (int)a.D;
            const void *const wpk = s + plan.c_wpk;
            if (st == TDT_STATUS_SUCCESS)
                st = dw ? cuda(tdt_gpu_wgmma_dw(f16, cp.hp, wpk, a.bias, a.V, a.O, a.blank, a.H, nb, cp.wrow, cp.kn, kp,
                                                wacc, plan.g_ldw, stream),
                               "launching the joint's d W on the chip")
                        : cuda(tdt_gpu_wgmma_dh(f16, cp.h, plan.g_ldh, wpk, a.bias, a.V, a.O, a.blank, a.H, nb, cp.wrow,
                                                cp.kn, kp, dx, stream),
                               "launching the joint's d h on the chip");
            if (st != TDT_STATUS_SUCCESS) return st;
            chip_rare_kernel<DT><<<1, 256, 0, stream>>>(ka, first, limit, nb, cp.wrow, cp.nrare, h, plan.g_ldh, cp.zr,
                                                        plan.g_ldz, dw ? NULL : dx, dw ? wacc : NULL, plan.g_ldw, kc);
            return cuda(cudaGetLastError(), "launching the joint's rare rows on the chip");
        } else {
            (void)ka, (void)first, (void)limit, (void)nb, (void)cp, (void)dw, (void)wacc, (void)dx;
            return TDT_STATUS_SUCCESS;
        }
    }
    /* A backward chunk's dz on wgmma, `count` nodes from first: h's rows (the h kernel), the
     * nodes' coefficients (gemm_coef_kernel, the bulk's into wrow), tdt_gpu_wgmma_dz from W
     * packed at z's start into dz (pitch ldz), then gemm_dz_fix_kernel. */
    /* The chip backward (chip_backward): W's O rows packed at c_wpk from W, then two sweeps over
     * the (b, t) rows in chunks of the plan's rows (chip_chunk), each with its parts
     * (tdt_gpu_chip_chunk) in the chip layout's area: d W and d bias into float32 sums at the
     * area's start (pitch ldw), written out after the last chunk (joint_dw_out_kernel); then d h
     * into the chunk's float32 rows, d(enc + pred) in place (gemm_dx_kernel) and its reductions
     * into d enc and the d pred sums, written out after the last chunk. The d h sweep's chunks
     * take the d W sums' bytes, so each sweep's chunks are as large as the area allows. */
    tdt_status_t backward_chip() const {
        const bool want_w = a.W_g || a.bias_g, want_x = a.enc_g || a.pred_g;
        char *const area = s + plan.c_area;
        joint_args ch = a;
        ch.pred_acc = s + plan.c_pred;
        ch.w_part = area;
        ch.b_part = reinterpret_cast<A *>(area) + a.H;
        tdt_status_t st = cuda(tdt_gpu_wgmma_pack(a.W, a.W_s, a.O, a.H, s + plan.c_wpk, num_sms, stream),
                               "launching the joint's W packing for wgmma");
        const int64_t all = a.B * a.maxT;
        for (int sweep = 0; sweep < 2 && st == TDT_STATUS_SUCCESS; ++sweep) {
            const bool dw = sweep == 0;
            if (dw ? !want_w : !want_x) continue;
            const int64_t rows_c = dw ? plan.c_rows_w : plan.c_rows_h, nb = rows_c * a.row;
            const size_t wbytes = (size_t)(plan.g_ldz * plan.g_ldw) * sizeof(float);
            tdt_gpu_chip_chunk_t cc;
            if (!tdt_gpu_chip_chunk(plan.c_area + (dw ? tdt_align_up(wbytes) : 0), nb, a.H, a.D, plan.g_ldh,
                                    plan.g_ldz, dw, !dw, &cc)) {
                tdt_set_error("the joint's chip layout overflows");
                return TDT_STATUS_INVALID_SIZE;
            }
            const chip_parts cp = {reinterpret_cast<E *>(s + cc.h),
                                   s + cc.hp,
                                   reinterpret_cast<tdt_wgmma_dz_row *>(s + cc.rows),
                                   reinterpret_cast<float *>(s + cc.kn),
                                   reinterpret_cast<int *>(s + cc.rare),
                                   reinterpret_cast<E *>(s + cc.zr),
                                   reinterpret_cast<float *>(s + cc.dx)};
            if ((st = cuda(cudaMemsetAsync(cp.nrare, 0, sizeof(int), stream), "clearing the joint's rare row count")) !=
                    TDT_STATUS_SUCCESS ||
                (dw && (st = cuda(cudaMemsetAsync(area, 0, wbytes, stream), "clearing d W")) != TDT_STATUS_SUCCESS) ||
                (!dw && a.pred_g &&
                 (st = cuda(cudaMemsetAsync(ch.pred_acc, 0, (size_t)(a.B * a.row * a.H) * sizeof(A), stream),
                            "clearing d pred")) != TDT_STATUS_SUCCESS))
                return st;
            for (int64_t r0 = 0; r0 < all && st == TDT_STATUS_SUCCESS; r0 += rows_c) {
                const int64_t rows = all - r0 < rows_c ? all - r0 : rows_c;
                const int64_t first = r0 * a.row, limit = (r0 + rows) * a.row;
                if ((st = chip_chunk(ch, first, limit, nb, cp, dw, dw ? reinterpret_cast<float *>(area) : NULL,
                                     dw ? NULL : cp.dx)) != TDT_STATUS_SUCCESS || dw)
                    continue;
                const int64_t count = rows * a.row;
                gemm_dx_kernel<DT><<<(unsigned)((count + 7) / 8), 256, 0, stream>>>(ch, first, limit, count,
                                                                                      reinterpret_cast<A *>(cp.dx));
                ch.dx = cp.dx;
                ch.chunk_row0 = r0;
                ch.chunk_rows = rows;
                if (a.enc_g) joint_denc_kernel<DT><<<reduce_blocks(rows, a.H, num_sms), 256, 0, stream>>>(ch);
                if (a.pred_g) joint_dpred_kernel<DT><<<reduce_blocks(a.row, a.H, num_sms), 256, 0, stream>>>(ch);
                st = cuda(cudaGetLastError(), "launching the joint's dx and reduction kernels");
            }
            if (st != TDT_STATUS_SUCCESS) return st;
            if (dw) joint_dw_out_kernel<DT><<<flat_blocks(a.O * a.H + a.O, num_sms), 256, 0, stream>>>(ch);
            else if (a.pred_g) joint_pred_out_kernel<DT><<<flat_blocks(a.B * a.row * a.H, num_sms), 256, 0, stream>>>(ch);
            st = cuda(cudaGetLastError(), "launching the joint's gradient outputs");
        }
        return st;
    }

    tdt_status_t dz_wgmma(const joint_args &ka, int64_t first, int64_t limit, int64_t count, E *dz,
                          tdt_wgmma_dz_row *wrow) const {
        const unsigned blocks = (unsigned)((count + 7) / 8);
        gemm_h_kernel<DT><<<blocks, 256, 0, stream>>>(ka, first, limit, count, hs(), plan.g_ldh, 1, NULL, NULL, 0,
                                                      wp(), 0);
        tdt_status_t st = cuda(cudaGetLastError(), "launching the joint's h kernel");
        if (st != TDT_STATUS_SUCCESS) return st;
        dz_coef *const coef = reinterpret_cast<dz_coef *>(s + plan.g_coef);
        gemm_coef_kernel<false><<<(unsigned)((count + 63) / 64), 64, 0, stream>>>(ka, first, limit, count, coef, wrow,
                                                                                 NULL, NULL);
        st = cuda(cudaGetLastError(), "launching the joint's coefficient kernel");
        if (st == TDT_STATUS_SUCCESS)
            st = cuda(tdt_gpu_wgmma_dz(DT == TDT_DTYPE_FLOAT16, hs(), plan.g_ldh, z(), a.bias, a.V, a.H, count, wrow,
                                       dz, plan.g_ldz, num_sms, stream),
                      "launching the joint's wgmma dz");
        if (st != TDT_STATUS_SUCCESS) return st;
        gemm_dz_fix_kernel<DT><<<blocks, 256, 0, stream>>>(ka, coef, count, hs(), plan.g_ldh, wp(), dz, plan.g_ldz);
        return cuda(cudaGetLastError(), "launching the joint's dz fix-up");
    }
#endif

    /* Whether this call's forward takes the chip layout (the wgmma forward with the plan's chip
     * layout): W padded is then in the chip's area, not at g_wp */
    bool chip_forward() const {
#if TDT_HAVE_WGMMA
        return plan.c_chip && wgmma_rows() > 0;
#else
        return false;
#endif
    }

    tdt_status_t forward() const {
        lt_gemm zg;
        tdt_status_t st = pad_w();
        if (st != TDT_STATUS_SUCCESS) return st;
#if TDT_HAVE_WGMMA
        if (const int64_t step = wgmma_rows()) return forward_wgmma(step);
#endif
        st = zgemm(&zg, false);
        if (st != TDT_STATUS_SUCCESS) return st;
        const int64_t all = a.B * a.maxT;
        for (int64_t r0 = 0; r0 < all; r0 += plan.g_rows) {
            const int64_t rows = all - r0 < plan.g_rows ? all - r0 : plan.g_rows;
            if ((st = hz(a, zg, r0, rows, 0)) != TDT_STATUS_SUCCESS) return st;
            const int64_t count = rows * a.row;
            gemm_node_kernel<DT><<<(unsigned)((count + 7) / 8), 256, 0, stream>>>(
                a, r0 * a.row, (r0 + rows) * a.row, reinterpret_cast<const E *>(z()), plan.g_ldz, hs(), wp(),
                plan.g_ldh);
            if ((st = cuda(cudaGetLastError(), "launching the joint's node kernel")) != TDT_STATUS_SUCCESS) return st;
        }
        return TDT_STATUS_SUCCESS;
    }

    /* a compacted chunk's kept nodes start this far apart in the list: its capacity less one row,
     * so that the rows starting in that range never overflow it (keep_chunk_kernel) */
    int64_t compact_step() const { return nodes(true) - a.row; }

    /* skip_below's compaction: where the backward leaves nodes out, outside a graph capture, with
     * room for two (b, t) rows a chunk or more (and the plan's int32 lists), the kept nodes are
     * listed (keep_rows_kernel, keep_scan_kernel) and their number read back (the call's one
     * synchronisation), and the backward's chunks are runs of them: ch->krow, kidx and desc set,
     * *nchunks their number. Otherwise nothing changes (every node goes through the products, a
     * left-out one as a zero row of dz). */
    tdt_status_t compact(joint_args *ch, int64_t *nchunks) const {
        const int64_t all = a.B * a.maxT;
        if (!(a.skip_below > 0.0) || !plan.g_compact || plan.g_rows_b < 2 || all < 1) return TDT_STATUS_SUCCESS;
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) { /* the legacy stream while another captures */
            (void)cudaGetLastError(); /* this call's error, not the caller's */
            return TDT_STATUS_SUCCESS;
        }
        if (cs != cudaStreamCaptureStatusNone) return TDT_STATUS_SUCCESS;
        tdt_status_t st;
        int32_t *const krow = reinterpret_cast<int32_t *>(s + plan.g_krow);
        int32_t *const kidx = reinterpret_cast<int32_t *>(s + plan.g_kidx);
        const unsigned blocks = (unsigned)((all + 7) / 8);
        keep_rows_kernel<false><<<blocks, 256, 0, stream>>>(a, all, krow, kidx);
        keep_scan_kernel<<<1, 1024, 0, stream>>>(krow, all + 1);
        keep_rows_kernel<true><<<blocks, 256, 0, stream>>>(a, all, krow, kidx);
        if ((st = cuda(cudaGetLastError(), "launching the joint's compaction")) != TDT_STATUS_SUCCESS) return st;
        int32_t kept = 0;
        if ((st = cuda(cudaMemcpyAsync(&kept, krow + all, sizeof kept, cudaMemcpyDeviceToHost, stream),
                       "reading the number of kept nodes")) != TDT_STATUS_SUCCESS ||
            (st = cuda(cudaStreamSynchronize(stream), "waiting for the number of kept nodes")) != TDT_STATUS_SUCCESS)
            return st;
        *nchunks = kept > 0 ? (kept + compact_step() - 1) / compact_step() : 1;
        ch->krow = krow;
        ch->kidx = kidx;
        ch->desc = reinterpret_cast<const int64_t *>(s + plan.g_desc);
        return TDT_STATUS_SUCCESS;
    }

    tdt_status_t backward() const {
#if TDT_HAVE_WGMMA
        if (chip_backward()) return backward_chip();
#endif
        const bool want_w = a.W_g || a.bias_g, want_x = a.enc_g || a.pred_g;
        A *const wacc = reinterpret_cast<A *>(s + plan.g_w);
        A *const dx = reinterpret_cast<A *>(s + plan.g_dx);
        /* dz in z's bytes; with dz on wgmma after W packed, in chunks of wg_rows (b, t) rows */
        size_t dz_off = 0;
#if TDT_HAVE_WGMMA
        const int64_t wg_rows = wgmma_bwd_rows();
        if (wg_rows) dz_off = tdt_gpu_wgmma_pack_bytes(a.V, a.H);
#else
        const int64_t wg_rows = 0;
#endif
        E *const dzw = reinterpret_cast<E *>(reinterpret_cast<char *>(z()) + dz_off);
        const E *const dz = dzw;
        lt_gemm zg, wg, hg, wg3[3];
        /* W padded: the forward's, but where this call's forward had the chip layout's */
        tdt_status_t st = call->c.do_forward && !chip_forward() ? TDT_STATUS_SUCCESS : pad_w();
        if (st == TDT_STATUS_SUCCESS && !wg_rows) st = zgemm(&zg, true);
        if (st != TDT_STATUS_SUCCESS) return st;
        cublasStatus_t c = CUBLAS_STATUS_SUCCESS;
        /* d W and d bias (ldh x O, column-major, pitch ldw) += h, its row of ones and its zero rows
         * (ldh x N) times dz^T (N x O): ldh rows, a multiple of 8, for cuBLASLt's vectorised
         * kernels (with 641 rows it took an sm_75 kernel at twice the d h product's time, H100);
         * without d W, the row of ones alone (d bias, row H) */
        const int64_t wrow0 = a.W_g ? 0 : a.H, wrows = a.W_g ? plan.g_ldh : 1;
        /* split products: d h is six products, of the parts (dz_i, W_j) with i + j < 3, smallest
         * first, into the same sums (the operands' alignments are those of the parts' blocks: the
         * kernels chosen for the least aligned); d W is three, the pairs of i + j = 2, 1 and 0 in
         * that order, each one product of three, two and one times the inner size: dz's parts
         * [dz0; dz1; dz2] (consecutive matrices) against h's stacked [h2; h1; h0] from its first,
         * second and third matrix on */
        const char *ops = reinterpret_cast<const char *>(dzsplit());
        const int64_t rows_b = wg_rows ? wg_rows : plan.g_rows_b, nb = rows_b * a.row;
        const size_t pstride = (size_t)(nb * plan.g_ldz) * 2, hblk = (size_t)plan.g_ldh * 2;
        const int pk = dw_dh_pick();
        if (want_w && split()) {
            for (int q = 0; q < 3 && c == CUBLAS_STATUS_SUCCESS; ++q)
                c = wg3[q].init(h, pk, lt_types<DT>::compute, lt_types<DT>::scale, CUDA_R_16BF, lt_types<DT>::d, false,
                                true, wrows, plan.g_ldz, (3 - q) * nb, hstacked() + q * nb * plan.g_ldh + wrow0,
                                plan.g_ldh, ops, plan.g_ldz, wacc + wrow0, plan.g_ldw, TDT_JOINT_LT_BYTES);
        } else if (want_w) {
            c = wg.init(h, pk, lt_types<DT>::compute, lt_types<DT>::scale, opnd(), lt_types<DT>::d, false, true, wrows,
                        plan.g_ldz, nb, hs() + wrow0, plan.g_ldhp, dz, plan.g_ldz, wacc + wrow0, plan.g_ldw,
                        TDT_JOINT_LT_BYTES);
        }
        if (c != CUBLAS_STATUS_SUCCESS) return lt_fail(c, "choosing cuBLASLt's kernel for d W = dz^T h");
        if (want_x) /* d h (H x N) = W padded (H x ldz) dz (ldz x N) */
            c = hg.init(h, pk, lt_types<DT>::compute, lt_types<DT>::scale, opnd(), lt_types<DT>::d, false, false, a.H,
                        nb, plan.g_ldz,
                        split() ? (const void *)(reinterpret_cast<const char *>(wp()) + hblk) : (const void *)wp(),
                        plan.g_ldwp, split() ? (const void *)(ops + pstride) : dz, plan.g_ldz, dx, a.H,
                        TDT_JOINT_LT_BYTES);
        if (c != CUBLAS_STATUS_SUCCESS) return lt_fail(c, "choosing cuBLASLt's kernel for d h = dz W");
        if (want_w) {
            if ((st = cuda(cudaMemsetAsync(wacc, 0, (size_t)(plan.g_ldz * plan.g_ldw) * sizeof(A), stream),
                           "clearing d W")) != TDT_STATUS_SUCCESS)
                return st;
        }
        if (a.pred_g && (st = cuda(cudaMemsetAsync(a.pred_acc, 0, (size_t)(a.B * a.row * a.H) * sizeof(A), stream),
                                   "clearing d pred")) != TDT_STATUS_SUCCESS)
            return st;
#if TDT_HAVE_WGMMA
        if (wg_rows && (st = cuda(tdt_gpu_wgmma_pack(wp(), plan.g_ldwp, a.V, a.H, z(), num_sms, stream),
                                  "launching the joint's W packing for wgmma")) != TDT_STATUS_SUCCESS)
            return st;
#endif
        const A one = 1, zero = 0;
#if TDT_HAVE_WGMMA
        /* the coefficients of dz on wgmma: in d h's buffer, free until the d h product */
        tdt_wgmma_dz_row *const wrow = reinterpret_cast<tdt_wgmma_dz_row *>(s + plan.g_dx);
#endif
        joint_args ch = a;
        const int64_t all = a.B * a.maxT;
        int64_t nchunks = (all + rows_b - 1) / rows_b;
        if ((st = compact(&ch, &nchunks)) != TDT_STATUS_SUCCESS) return st;
        for (int64_t k = 0; k < nchunks; ++k) {
            /* dense: rows [r0, r0 + rows), nodes [first, limit); compacted: ch.desc's */
            int64_t r0 = 0, rows = 0;
            if (ch.kidx) {
                keep_chunk_kernel<<<1, 1, 0, stream>>>(ch.krow, all, k, nchunks, compact_step(),
                                                       reinterpret_cast<int64_t *>(s + plan.g_desc));
                if ((st = cuda(cudaGetLastError(), "launching the joint's chunk kernel")) != TDT_STATUS_SUCCESS)
                    return st;
            } else {
                r0 = k * rows_b;
                rows = all - r0 < rows_b ? all - r0 : rows_b;
            }
            const int64_t first = r0 * a.row, limit = (r0 + rows) * a.row;
#if TDT_HAVE_WGMMA
            if (wg_rows) {
                if ((st = dz_wgmma(ch, first, limit, nb, dzw, wrow)) != TDT_STATUS_SUCCESS) return st;
            } else
#endif
            {
                if ((st = hz(ch, zg, r0, rows, 1)) != TDT_STATUS_SUCCESS) return st;
                if (split() && (st = cuda(cudaMemsetAsync(nf(), 0, sizeof(int), stream),
                                          "clearing the joint's flag count")) != TDT_STATUS_SUCCESS)
                    return st;
                launch_dz(ch, first, limit, dzw);
                if ((st = cuda(cudaGetLastError(), "launching the joint's dz kernel")) != TDT_STATUS_SUCCESS)
                    return st;
            }
            const int nterms = split() ? kSplitTerms : 1;
            if (want_w) {
                if (split()) {
                    for (int q = 0; q < 3 && c == CUBLAS_STATUS_SUCCESS; ++q)
                        c = wg3[q].run(h, &one, hstacked() + q * nb * plan.g_ldh + wrow0, ops, &one, wacc + wrow0,
                                       ws(), TDT_JOINT_LT_BYTES, stream);
                } else {
                    c = wg.run(h, &one, hs() + wrow0, dz, &one, wacc + wrow0, ws(), TDT_JOINT_LT_BYTES, stream);
                }
                if (c != CUBLAS_STATUS_SUCCESS) return lt_fail(c, "cublasLtMatmul (d W += dz^T h)");
                if (split()) {
                    split_fix_dw_kernel<<<(unsigned)num_sms, 256, 0, stream>>>(
                        nf(), nodes(true), reinterpret_cast<const float *>(dz), plan.g_ldz, hsplit(), plan.g_ldh,
                        reinterpret_cast<float *>(wacc), plan.g_ldw, wrow0, wrows, a.O);
                    if ((st = cuda(cudaGetLastError(), "launching the joint's d W fix-up")) != TDT_STATUS_SUCCESS)
                        return st;
                }
            }
            if (!want_x) continue;
            for (int t = 0; t < nterms && c == CUBLAS_STATUS_SUCCESS; ++t) {
                const void *ww = wp(), *dd = dz;
                if (split()) {
                    ww = reinterpret_cast<const char *>(wp()) + kSplitTerm[t][1] * hblk; /* W_j: block j */
                    dd = ops + kSplitTerm[t][0] * pstride;
                }
                c = hg.run(h, &one, ww, dd, t == 0 ? &zero : &one, dx, ws(), TDT_JOINT_LT_BYTES, stream);
            }
            if (c != CUBLAS_STATUS_SUCCESS) return lt_fail(c, "cublasLtMatmul (d h = dz W)");
            if (split()) {
                split_fix_dh_kernel<<<(unsigned)num_sms, 256, 0, stream>>>(
                    a, nf(), nodes(true), reinterpret_cast<const float *>(dz), plan.g_ldz, reinterpret_cast<float *>(dx));
                if ((st = cuda(cudaGetLastError(), "launching the joint's d h fix-up")) != TDT_STATUS_SUCCESS) return st;
            }
            const int64_t count = ch.kidx ? nodes(true) : rows * a.row;
            gemm_dx_kernel<DT><<<(unsigned)((count + 7) / 8), 256, 0, stream>>>(ch, first, limit, count, dx);
            if ((st = cuda(cudaGetLastError(), "launching the joint's dx kernel")) != TDT_STATUS_SUCCESS) return st;
            ch.chunk_row0 = r0;
            ch.chunk_rows = rows;
            if (a.enc_g) {
                joint_denc_kernel<DT><<<reduce_blocks(ch.kidx ? all : rows, a.H, num_sms), 256, 0, stream>>>(ch);
                if ((st = cuda(cudaGetLastError(), "launching the joint's d enc kernel")) != TDT_STATUS_SUCCESS)
                    return st;
            }
            if (a.pred_g) {
                joint_dpred_kernel<DT><<<reduce_blocks(a.row, a.H, num_sms), 256, 0, stream>>>(ch);
                if ((st = cuda(cudaGetLastError(), "launching the joint's d pred kernel")) != TDT_STATUS_SUCCESS)
                    return st;
            }
        }
        if (a.pred_g) {
            joint_pred_out_kernel<DT><<<flat_blocks(a.B * a.row * a.H, num_sms), 256, 0, stream>>>(a);
            if ((st = cuda(cudaGetLastError(), "launching the joint's d pred output")) != TDT_STATUS_SUCCESS) return st;
        }
        if (want_w) {
            joint_dw_out_kernel<DT><<<flat_blocks(a.O * a.H + a.O, num_sms), 256, 0, stream>>>(a);
            if ((st = cuda(cudaGetLastError(), "launching the joint's d W output")) != TDT_STATUS_SUCCESS) return st;
        }
        return TDT_STATUS_SUCCESS;
    }
};

template <int DT>
tdt_status_t gemm_go(const tdt_joint_call_t *call, const tdt_gpu_joint_plan_t &plan, cublasLtHandle_t h, int num_sms,
                     int backward, const joint_gemm_opts &o, int device) {
    char *const s = joint_scratch(call);
    gemm_run<DT> r{call, plan, args_of(call, plan), (cudaStream_t)call->c.o.stream, num_sms, h, s, o.lt_pick,
                   o.wgmma_forward, device, o.wgmma_backward};
    /* the reductions of joint_common.cuh read the GEMM schedule's buffers */
    r.a.dx = s + plan.g_dx;
    r.a.pred_acc = s + plan.g_pred;
    r.a.w_part = s + plan.g_w;
    r.a.b_part = reinterpret_cast<acc_t<DT> *>(s + plan.g_w) + r.a.H;
    r.a.parts = 1;
    r.a.w_ld = plan.g_ldw;
    r.a.b_ld = plan.g_ldw;
    r.chip_wp = !backward && r.chip_forward();
    return backward ? r.backward() : r.forward();
}

} /* namespace */

bool tdt_gpu_joint_gemm_available() { return lt().ok; }

tdt_status_t tdt_gpu_joint_gemm(const tdt_joint_call_t *call, const tdt_gpu_joint_plan_t *plan, int device,
                                int num_sms, int backward, const joint_gemm_opts &opts) {
    if (!lt().ok) {
        tdt_set_error("the GPU joint's GEMM schedule (TDT_GPU_JOINT=gemm) needs cuBLASLt: %s", lt().why);
        return TDT_STATUS_CUDA_ERROR;
    }
    cublasStatus_t cs;
    const cublasLtHandle_t h = lt_handle(device, &cs);
    if (!h) return lt_fail(cs, "cublasLtCreate");
    switch (call->jp.dtype) {
    case TDT_DTYPE_FLOAT32: return gemm_go<TDT_DTYPE_FLOAT32>(call, *plan, h, num_sms, backward, opts, device);
    case TDT_DTYPE_FLOAT64: return gemm_go<TDT_DTYPE_FLOAT64>(call, *plan, h, num_sms, backward, opts, device);
    case TDT_DTYPE_FLOAT16: return gemm_go<TDT_DTYPE_FLOAT16>(call, *plan, h, num_sms, backward, opts, device);
    case TDT_DTYPE_BFLOAT16: return gemm_go<TDT_DTYPE_BFLOAT16>(call, *plan, h, num_sms, backward, opts, device);
    }
    tdt_set_error("problem->dtype = %d", (int)call->jp.dtype);
    return TDT_STATUS_INVALID_DTYPE;
}
