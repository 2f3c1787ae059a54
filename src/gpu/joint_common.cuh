/*
 * joint_common.cuh - what the GPU fused joint's two schedules share (joint.cu: tiles of nodes
 * against tiles of W's rows, the logits never leaving the chip; joint_gemm.cu: chunks of nodes
 * through cuBLASLt's matrix products, the chunk's logits in the scratch): the kernels'
 * arguments, the per-node setup of the forward and the backward, the hidden values, and the
 * reductions of d(enc + pred) into d enc and d pred. Included by those two files only.
 */
#ifndef TDT_GPU_JOINT_COMMON_CUH
#define TDT_GPU_JOINT_COMMON_CUH

#include "common/joint.h"
#include "gpu_common.cuh"
#include "joint_plan.h"

namespace {

/* Everything the joint's kernels read, by value. */
struct joint_args {
    int64_t B, maxT, maxU, row, V, O, H, nodes;
    int D, blank, act;
    int dropout;            /* 0: none */
    uint32_t drop_thr;      /* tdt_dropout_threshold */
    double drop_scale;      /* tdt_dropout_scale */
    uint64_t seed, offset;
    double sigma, lambda, clamp;
    const void *enc, *pred, *W, *bias;
    int64_t enc_s[2], pred_s[2], W_s;
    const int32_t *labels, *frame_lengths, *label_lengths;
    tdt_arcs_t arcs;
    tdt_ws_t ws;
    tdt_wblocks_t wb;
    tdt_gpu_args_t lat;     /* what gpu_common.cuh's tdt_sample_lattice reads (D, wb, row, maxT) */
    const void *grad_costs;
    int acc_double, grad_costs_scalar, normalize_costs, batch_mean;
    void *enc_g, *pred_g, *W_g, *bias_g;
    int64_t enc_gs[2], pred_gs[2], W_gs;
    void *dx, *pred_acc, *w_part, *b_part; /* the scratch (joint_plan.h) */
    int64_t parts;
    int64_t w_ld, b_ld; /* a partition's d W element (o, k) at w_part[o w_ld + k], d bias[o] at b_part[o b_ld] */
    int64_t chunk_row0, chunk_rows; /* the backward's current chunk of (b, t) rows */
    double skip_below;              /* tdt_joint_gradients_t.skip_below */
    /* skip_below's compacted backward (joint_gemm.cu), else NULL: where each (b, t) row's kept
     * nodes start in kidx (B maxT + 1 entries), the kept nodes ascending, and the current
     * chunk (its first and end row, its first and end entry of kidx), which then replaces
     * chunk_row0 and chunk_rows */
    const int32_t *krow, *kidx;
    const int64_t *desc;
};

template <int DT> using acc_t = typename tdt_elem<DT>::Acc;

template <int DT> __device__ __forceinline__ acc_t<DT> ld(const void *p, int64_t i) {
    return tdt_elem<DT>::to_acc(static_cast<const typename tdt_elem<DT>::T *>(p)[i]);
}
template <int DT> __device__ __forceinline__ void st(void *p, int64_t i, acc_t<DT> x) {
    static_cast<typename tdt_elem<DT>::T *>(p)[i] = tdt_elem<DT>::from_acc(x);
}

/* NaN-keeping max (lattice.h's tdt_lse_max) in the accumulate type. */
template <typename A> __device__ __forceinline__ A max_nan(A m, A x) { return (x > m || x != x) ? x : m; }

/* The activation and its derivative from x and y = act(x). */
template <typename A> __device__ __forceinline__ A act_of(int act, A x) {
    switch (act) {
    case TDT_ACTIVATION_RELU: return x > (A)0 ? x : (A)0;
    case TDT_ACTIVATION_TANH: return tanh(x);
    case TDT_ACTIVATION_SIGMOID: return (A)1 / ((A)1 + exp(-x));
    default: return x;
    }
}
template <typename A> __device__ __forceinline__ A act_grad(int act, A x, A y) {
    switch (act) {
    case TDT_ACTIVATION_RELU: return x > (A)0 ? (A)1 : (A)0;
    case TDT_ACTIVATION_TANH: return (A)1 - y * y;
    case TDT_ACTIVATION_SIGMOID: return y * ((A)1 - y);
    default: return (A)1;
    }
}

/* A node of a tile, in shared memory. */
struct node_info {
    int64_t b, t, u;
    uint64_t ctr; /* dropout counter of its element 0 */
    int valid;    /* forward: inside its lattice, lengths in range; backward: and feasible */
    int y;        /* its label when it has one in [0, V) other than blank, else -1 */
    int has_label; /* u < U_b */
};

/* Node n of the padded (b, t, u) order into ni; valid as the forward takes it (lengths in range,
 * t < T_b, u <= U_b), n < limit. */
__device__ __forceinline__ void node_decode(const joint_args &a, int64_t n, int64_t limit,
                                            node_info *ni, int64_t *Tb, int64_t *Ub) {
    ni->valid = 0;
    ni->y = -1;
    ni->has_label = 0;
    ni->b = ni->t = ni->u = 0;
    ni->ctr = 0;
    *Tb = *Ub = 0;
    if (n >= limit) return;
    const int64_t per = a.maxT * a.row;
    if (n <= (int64_t)UINT32_MAX && per <= (int64_t)UINT32_MAX) { /* 32-bit divisions: far fewer instructions */
        const uint32_t n32 = (uint32_t)n, per32 = (uint32_t)per, row32 = (uint32_t)a.row;
        const uint32_t b = n32 / per32, r = n32 - b * per32, t = r / row32;
        ni->b = b;
        ni->t = t;
        ni->u = r - t * row32;
    } else {
        ni->b = n / per;
        const int64_t r = n - ni->b * per;
        ni->t = r / a.row;
        ni->u = r - ni->t * a.row;
    }
    const int64_t tb = a.frame_lengths[ni->b], ub = a.label_lengths[ni->b];
    if (tb < 0 || tb > a.maxT || ub < 0 || ub > a.maxU || ni->t >= tb || ni->u > ub) return;
    *Tb = tb;
    *Ub = ub;
    ni->valid = 1;
    ni->has_label = ni->u < ub;
    if (ni->has_label) {
        const int32_t y = a.labels[ni->b * a.maxU + ni->u];
        ni->y = (y >= 0 && y < a.V && y != a.blank) ? y : -1;
    }
    ni->ctr = tdt_dropout_counter(a.offset, ni->b, ni->t, ni->u, a.maxT, a.maxU, a.H);
}

/* x = enc + pred and the dropout's factor (0, or its scale) at elements k0 .. k0 + M - 1 of node
 * ni, in the accumulate type (as the CPU backend has them), whose rows of enc and pred start at
 * er and pr (the dtype; hidden_rows), M values a load: for M > 1 the caller has checked that both
 * rows start aligned to M values and that k0 + M <= H (k0 a multiple of M). */
template <int DT, int M> struct hidden_vals {
    typedef typename tdt_elem<DT>::T E;
    struct alignas(M * sizeof(E)) raw {
        E v[M];
    };
    acc_t<DT> x[M], keep[M];
    __device__ __forceinline__ void load(const joint_args &a, const node_info &ni, const E *er, const E *pr,
                                         int64_t k0) {
        const raw e = *reinterpret_cast<const raw *>(er + k0), p = *reinterpret_cast<const raw *>(pr + k0);
#pragma unroll
        for (int i = 0; i < M; ++i) x[i] = tdt_elem<DT>::to_acc(e.v[i]) + tdt_elem<DT>::to_acc(p.v[i]);
        if (a.dropout) { /* tested once, not an element */
#pragma unroll
            for (int i = 0; i < M; ++i)
                keep[i] = tdt_dropout_keep(a.seed, ni.ctr + (uint64_t)(k0 + i), a.drop_thr) ? (acc_t<DT>)a.drop_scale
                                                                                           : (acc_t<DT>)0;
        } else {
#pragma unroll
            for (int i = 0; i < M; ++i) keep[i] = (acc_t<DT>)1;
        }
    }
};

/* Node ni's rows of enc and pred (the dtype), and whether both start aligned to M values. */
template <int DT, int M>
__device__ __forceinline__ bool hidden_rows(const joint_args &a, const node_info &ni,
                                            const typename tdt_elem<DT>::T **er, const typename tdt_elem<DT>::T **pr) {
    typedef typename tdt_elem<DT>::T E;
    *er = static_cast<const E *>(a.enc) + ni.b * a.enc_s[0] + ni.t * a.enc_s[1];
    *pr = static_cast<const E *>(a.pred) + ni.b * a.pred_s[0] + ni.u * a.pred_s[1];
    return ((reinterpret_cast<uintptr_t>(*er) | reinterpret_cast<uintptr_t>(*pr)) % (M * sizeof(E))) == 0;
}

/* h = dropout(act(x)) from x and the dropout's factor; d(enc + pred) from d h: d h times the
 * dropout's factor and act'. */
template <typename A> __device__ __forceinline__ A hidden_of(int act, A x, A keep) { return act_of(act, x) * keep; }
template <typename A> __device__ __forceinline__ A hidden_dx(int act, A dh, A x, A keep) {
    return dh * keep * act_grad(act, x, act_of(act, x));
}

/* h at element k of node ni (hidden_vals, one value), *x_out its x and *keep_out the dropout's
 * factor for the backward. */
template <int DT>
__device__ __forceinline__ acc_t<DT> hidden(const joint_args &a, const node_info &ni, int64_t k,
                                            acc_t<DT> *x_out, acc_t<DT> *keep_out) {
    const typename tdt_elem<DT>::T *er, *pr;
    (void)hidden_rows<DT, 1>(a, ni, &er, &pr);
    hidden_vals<DT, 1> hv;
    hv.load(a, ni, er, pr, k);
    *x_out = hv.x[0];
    *keep_out = hv.keep[0];
    return hidden_of(a.act, hv.x[0], hv.keep[0]);
}

/* d(enc + pred) at element k of node ni from its d h (hidden_dx). */
template <int DT>
__device__ __forceinline__ acc_t<DT> node_dx(const joint_args &a, const node_info &ni, int64_t k, acc_t<DT> dh) {
    acc_t<DT> x, keep;
    (void)hidden<DT>(a, ni, k, &x, &keep);
    return hidden_dx(a.act, dh, x, keep);
}

/* A node's gradient coefficients, in shared memory. */
struct node_coef {
    double lse, gb;
    double pb, py; /* the blank's and the label's probabilities, from the forward's node block */
    tdt_node_grad_t g;
    double q[TDT_MAX_DURATIONS]; /* the duration softmax */
};

/* Whether sample b enters the backward: its lattice's state OK and log p(y|x) > -inf. */
__device__ __forceinline__ bool sample_feasible(const joint_args &a, int64_t b) {
    return a.ws.state[b] == TDT_GPU_STATE_OK && a.ws.ll[b] != -TDT_INF;
}

/* Node n (n < limit) of the padded order: ni as node_decode, valid only where its sample is
 * feasible, and then its coefficients (lattice.h). */
__device__ __noinline__ void node_setup_bwd(const joint_args &a, int64_t n, int64_t limit,
                                            node_info *ni, node_coef *nc) {
    int64_t Tb, Ub;
    node_decode(a, n, limit, ni, &Tb, &Ub);
    if (!ni->valid) return;
    const int64_t b = ni->b;
    const double ll = a.ws.ll[b];
    if (!sample_feasible(a, b)) {
        ni->valid = 0;
        return;
    }
    const tdt_lattice_t L = tdt_sample_lattice(a.lat, b, Tb, Ub);
    const int64_t off = tdt_sample_offset(b, a.maxT, a.row);
    tdt_node_grad(&L, &a.arcs, a.ws.alpha + off, a.ws.beta + off, ni->t, ni->u, ll, a.lambda, &nc->g);
    nc->gb = tdt_upstream(a.grad_costs, a.acc_double, a.grad_costs_scalar, b, a.batch_mean ? a.B : 0,
                          a.normalize_costs, Ub);
    const double *w = tdt_node_block(&L, ni->t, ni->u);
    nc->lse = w[tdt_w_lse(a.D)];
    nc->pb = exp(w[TDT_W_BLANK] + a.sigma);
    nc->py = ni->y >= 0 ? exp(w[TDT_W_LABEL] + a.sigma) : 0.0;
    for (int k = 0; k < a.D; ++k) nc->q[k] = exp(w[TDT_W_DUR + k]);
    if (tdt_joint_skips(a.skip_below, nc->gb, &nc->g)) ni->valid = 0; /* left out: dz taken as 0 */
}

/* Node n's block of the workspace, as the loss's normaliser writes it, from its token
 * log-normaliser lse and its blank, label and D duration logits (bias included; zy is read
 * only where the node has a label arc). */
template <typename A>
__device__ __forceinline__ void node_block(const joint_args &a, const node_info &n, double lse, A zb, A zy,
                                           const A *zd) {
    double *const w = tdt_wblock(&a.wb, n.b, n.t, n.u);
    w[tdt_w_lse(a.D)] = lse;
    w[TDT_W_BLANK] = (double)zb - lse - a.sigma;
    /* u == U_b: no label arc; a bad label: NaN, never indexed (the sweep flags it) */
    w[TDT_W_LABEL] = !n.has_label ? -TDT_INF : n.y >= 0 ? (double)zy - lse - a.sigma : (double)NAN;
    if (a.D > 0) {
        for (int k = 0; k < a.D; ++k) w[TDT_W_DUR + k] = (double)zd[k];
        tdt_log_softmax_small(w + TDT_W_DUR, a.D, 1, 1);
    }
}

/* dz of node ni at an output o < O whose probability the node's coefficients hold (the blank,
 * its label, the durations): the upstream gradient times lattice.h's tdt_token_grad or
 * tdt_duration_grad. */
__device__ __forceinline__ double node_dz_known(const joint_args &a, const node_info &ni, const node_coef &c,
                                                int64_t o) {
    if (o < a.V) return c.gb * tdt_token_grad(&c.g, o == a.blank ? c.pb : c.py, o == a.blank, o == ni.y, a.clamp);
    const int k = (int)(o - a.V);
    return c.gb * tdt_duration_grad(&c.g, c.q[k], k);
}

/* dz of node ni at output o < O from its logit z (bias included). */
template <typename A>
__device__ __forceinline__ double node_dz(const joint_args &a, const node_info &ni, const node_coef &c, int64_t o,
                                          A z) {
    if (o < a.V && o != a.blank && o != ni.y) return c.gb * tdt_token_grad(&c.g, exp((double)z - c.lse), 0, 0, a.clamp);
    return node_dz_known(a, ni, c, o);
}

/* The backward's current chunk: its first (b, t) row, its number of rows, and (compacted) the
 * entry of kidx of its first node; dense, its rows' nodes are all there, (U + 1) a row. */
struct chunk_view {
    int64_t r0, rows, m0;
};
__device__ __forceinline__ chunk_view chunk_of(const joint_args &a) {
    chunk_view c;
    if (a.kidx) {
        c.r0 = a.desc[0];
        c.rows = a.desc[1] - a.desc[0];
        c.m0 = a.desc[2];
    } else {
        c.r0 = a.chunk_row0;
        c.rows = a.chunk_rows;
        c.m0 = 0;
    }
    return c;
}

/* The chunk's node j (j < its capacity) as a node of the padded order and the limit node_decode
 * takes it with: dense, first + j below limit; compacted, its kept node j, and none (limit 0)
 * past those. */
__device__ __forceinline__ int64_t chunk_node(const joint_args &a, int64_t first, int64_t limit, int64_t j,
                                              int64_t *lim) {
    if (!a.kidx) {
        *lim = limit;
        return first + j;
    }
    const int64_t m = a.desc[2] + j;
    if (m >= a.desc[3]) {
        *lim = 0;
        return 0;
    }
    const int64_t n = a.kidx[m];
    *lim = n + 1;
    return n;
}

/* Where row q of the chunk (c.r0 + q) has its nodes in the chunk's dx: rows [*p0, *p1). */
__device__ __forceinline__ void chunk_row_span(const joint_args &a, const chunk_view &c, int64_t q, int64_t *p0,
                                               int64_t *p1) {
    if (a.kidx) {
        *p0 = a.krow[c.r0 + q] - c.m0;
        *p1 = a.krow[c.r0 + q + 1] - c.m0;
    } else {
        *p0 = q * a.row;
        *p1 = *p0 + a.row;
    }
}

/* The row of the chunk's dx that holds node (row q of the chunk, u), or -1 where the compacted
 * chunk left it out (a binary search of the row's kept nodes). */
__device__ __forceinline__ int64_t chunk_pos(const joint_args &a, const chunk_view &c, int64_t q, int64_t u) {
    if (!a.kidx) return q * a.row + u;
    int64_t lo = a.krow[c.r0 + q], hi = a.krow[c.r0 + q + 1];
    const int32_t want = (int32_t)((c.r0 + q) * a.row + u);
    while (lo < hi) {
        const int64_t mid = (lo + hi) >> 1;
        if (a.kidx[mid] < want) lo = mid + 1;
        else hi = mid;
    }
    return lo < a.krow[c.r0 + q + 1] && a.kidx[lo] == want ? lo - c.m0 : -1;
}

/* The reductions below: a block of eight warps takes 32 consecutive hidden values k (a lane
 * each) of one output row; warp w sums the terms w, w + 8, w + 16, ... of the row's range in
 * order, and the eight sums are added in warp order. A fixed order (deterministic), whatever the
 * grid; eight loads in flight a lane. */
const int kReduceWarps = 8;

/* The eight warps' sums s of lane k's output joined in warp order: warp 0's lanes get it. */
template <typename A> __device__ __forceinline__ A reduce_warps(A s, A (&part)[kReduceWarps][32]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    part[w][lane] = s;
    __syncthreads();
    A t = part[0][lane];
#pragma unroll
    for (int i = 1; i < kReduceWarps; ++i) t += part[i][lane];
    __syncthreads(); /* part free for the next row */
    return t;
}

/* d enc of the chunk's (b, t) rows: the sum over u (reduce_warps' order) of their nodes' dx
 * (compacted: of their kept nodes', zero for a row with none). Blocks of 256 threads, a block a
 * (row, 32 values of k) at a time. */
template <int DT> __global__ void __launch_bounds__(256) joint_denc_kernel(const __grid_constant__ joint_args a) {
    typedef acc_t<DT> A;
    __shared__ A part[kReduceWarps][32];
    const A *dx = static_cast<const A *>(a.dx);
    const chunk_view c = chunk_of(a);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t kb = (a.H + 31) / 32, n = c.rows * kb;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) { /* block-uniform */
        const int64_t r = i / kb, k = (i - r * kb) * 32 + lane;
        const int64_t rr = c.r0 + r, b = rr / a.maxT, t = rr - b * a.maxT;
        int64_t p0, p1;
        chunk_row_span(a, c, r, &p0, &p1);
        A s = 0;
        if (k < a.H) {
#pragma unroll 8 /* eight loads in flight (the sum's order unchanged) */
            for (int64_t p = p0 + w; p < p1; p += kReduceWarps) s += dx[p * a.H + k];
        }
        s = reduce_warps(s, part);
        if (w == 0 && k < a.H) st<DT>(a.enc_g, b * a.enc_gs[0] + t * a.enc_gs[1] + k, s);
    }
}

/* d pred: each (b, u, k) of the chunk's samples gets the sum over the chunk's frames
 * (reduce_warps' order; compacted: those where the node was kept) added to its accumulator.
 * Blocks of 256 threads, a block a (u, 32 values of k) at a time. */
template <int DT> __global__ void __launch_bounds__(256) joint_dpred_kernel(const __grid_constant__ joint_args a) {
    typedef acc_t<DT> A;
    __shared__ A part[kReduceWarps][32];
    const A *dx = static_cast<const A *>(a.dx);
    A *accp = static_cast<A *>(a.pred_acc);
    const chunk_view c = chunk_of(a);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t kb = (a.H + 31) / 32, n = a.row * kb;
    const int64_t b0 = c.r0 / a.maxT, t0 = c.r0 - b0 * a.maxT;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) { /* block-uniform */
        const int64_t u = i / kb, k = (i - u * kb) * 32 + lane;
        /* the chunk's rows sample by sample: rows [r, r_end) are sample b's frames */
        int64_t b = b0, r = 0, r_end = a.maxT - t0;
        while (r < c.rows) {
            if (r_end > c.rows) r_end = c.rows;
            A s = 0;
            if (k < a.H) {
                if (a.kidx) {
                    for (int64_t q = r + w; q < r_end; q += kReduceWarps) {
                        const int64_t p = chunk_pos(a, c, q, u);
                        if (p >= 0) s += dx[p * a.H + k];
                    }
                } else {
#pragma unroll 8 /* eight loads in flight (the sum's order unchanged) */
                    for (int64_t q = r + w; q < r_end; q += kReduceWarps) s += dx[(q * a.row + u) * a.H + k];
                }
            }
            s = reduce_warps(s, part);
            if (w == 0 && k < a.H) accp[(b * a.row + u) * a.H + k] += s;
            r = r_end;
            r_end += a.maxT;
            ++b;
        }
    }
}

template <int DT> __global__ void joint_pred_out_kernel(const __grid_constant__ joint_args a) {
    const acc_t<DT> *accp = static_cast<const acc_t<DT> *>(a.pred_acc);
    const int64_t n = a.B * a.row * a.H;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = idx % a.H, bu = idx / a.H, b = bu / a.row, u = bu - b * a.row;
        st<DT>(a.pred_g, b * a.pred_gs[0] + u * a.pred_gs[1] + k, accp[idx]);
    }
}

/* d W and d bias: the P partitions (each O w_ld and O b_ld elements apart) summed in order,
 * written in the dtype. */
template <int DT> __global__ void joint_dw_out_kernel(const __grid_constant__ joint_args a) {
    const acc_t<DT> *wp = static_cast<const acc_t<DT> *>(a.w_part);
    const acc_t<DT> *bp = static_cast<const acc_t<DT> *>(a.b_part);
    const int64_t n = a.O * a.H;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n + a.O;
         idx += (int64_t)gridDim.x * blockDim.x) {
        acc_t<DT> s = 0;
        if (idx < n) {
            if (!a.W_g) continue;
            const int64_t o = idx / a.H, k = idx - o * a.H;
            for (int64_t p = 0; p < a.parts; ++p) s += wp[(p * a.O + o) * a.w_ld + k];
            st<DT>(a.W_g, o * a.W_gs + k, s);
        } else {
            if (!a.bias_g) continue;
            const int64_t o = idx - n;
            for (int64_t p = 0; p < a.parts; ++p) s += bp[(p * a.O + o) * a.b_ld];
            st<DT>(a.bias_g, o, s);
        }
    }
}

/* Blocks of a grid-striding elementwise kernel over n elements. */
inline unsigned flat_blocks(int64_t n, int num_sms) {
    int64_t blocks = (n + 255) / 256;
    const int64_t cap = (int64_t)num_sms * 16;
    if (blocks > cap) blocks = cap;
    return blocks < 1 ? 1u : (unsigned)blocks;
}

/* The grid of joint_denc_kernel and joint_dpred_kernel: a block of 256 threads a (row, 32 values
 * of k) of rows output rows (for d enc the chunk's (b, t) rows, or a bound on them; for d pred
 * U + 1), flat_blocks' cap. */
inline unsigned reduce_blocks(int64_t rows, int64_t H, int num_sms) {
    return flat_blocks(rows * ((H + 31) / 32) * 256, num_sms);
}

/* The scratch's start: scratch_offset bytes past the aligned workspace, aligned again. */
inline char *joint_scratch(const tdt_joint_call_t *call) {
    char *const base = (char *)tdt_align_up((size_t)(uintptr_t)call->c.workspace) + call->scratch_offset;
    return base + ((TDT_WS_ALIGN - ((uintptr_t)base & (TDT_WS_ALIGN - 1))) & (TDT_WS_ALIGN - 1));
}

/* The kernels' arguments from the validated call, the tiles' scratch carved by plan. */
joint_args args_of(const tdt_joint_call_t *call, const tdt_gpu_joint_plan_t &plan) {
    const tdt_joint_problem_t &p = call->jp;
    const tdt_call_t &c = call->c;
    joint_args a;
    memset(&a, 0, sizeof a);
    a.B = p.batch;
    a.maxT = p.max_frames;
    a.maxU = p.max_labels;
    a.row = p.max_labels + 1;
    a.V = p.vocab_size;
    a.O = p.num_outputs;
    a.H = p.hidden;
    a.nodes = c.layout.nodes;
    a.D = c.tdt_mode ? c.num_durations : 0;
    a.blank = c.o.blank;
    a.act = (int)p.activation;
    a.dropout = tdt_dropout_threshold(p.dropout) != 0; /* as the CPU: no mask, no scale */
    a.drop_thr = tdt_dropout_threshold(p.dropout);
    a.drop_scale = tdt_dropout_scale(p.dropout);
    a.seed = p.dropout_seed;
    a.offset = p.dropout_offset;
    a.sigma = c.o.sigma;
    a.lambda = c.o.fastemit_lambda;
    a.clamp = c.o.clamp;
    a.enc = p.enc;
    a.pred = p.pred;
    a.W = p.weight;
    a.bias = p.bias;
    for (int i = 0; i < 2; ++i) {
        a.enc_s[i] = p.enc_strides[i];
        a.pred_s[i] = p.pred_strides[i];
        a.enc_gs[i] = call->jg.enc_strides[i];
        a.pred_gs[i] = call->jg.pred_strides[i];
    }
    a.W_s = p.weight_stride;
    a.labels = p.labels;
    a.frame_lengths = p.frame_lengths;
    a.label_lengths = p.label_lengths;
    a.arcs = c.arcs;
    if (c.workspace) {
        tdt_workspace_carve(&c.layout, c.workspace, &a.ws);
        a.wb = tdt_wblocks_ws(a.ws.w, c.layout.block, p.max_frames, p.max_labels + 1);
        a.lat.D = a.D;
        a.lat.wb = a.wb;
        a.lat.row = a.row;
        a.lat.maxT = a.maxT;
        char *const s = joint_scratch(call);
        a.dx = s + plan.dx;
        a.pred_acc = s + plan.pred_acc;
        a.w_part = s + plan.w_part;
        a.b_part = s + plan.b_part;
    }
    a.grad_costs = c.grad_costs;
    a.acc_double = tdt_acc_is_double(p.dtype);
    a.grad_costs_scalar = c.o.grad_costs_scalar != 0;
    a.normalize_costs = c.o.normalize_costs != 0;
    a.batch_mean = c.o.batch_mean != 0;
    a.enc_g = call->jg.enc_grad;
    a.pred_g = call->jg.pred_grad;
    a.W_g = call->jg.weight_grad;
    a.W_gs = call->jg.weight_stride;
    a.bias_g = call->jg.bias_grad;
    a.skip_below = call->jg.skip_below;
    a.parts = plan.parts;
    a.w_ld = a.H;
    a.b_ld = 1;
    return a;
}

} /* namespace */

/* Which of cuBLASLt's kernels the GEMM schedule's products take (joint_gemm.cu's lt_choose;
 * joint.cu's TDT_GPU_JOINT_LT): the heuristic's first, the candidate with the fewest waves, or
 * by product (the default: the first for z, the fewest waves for d W and d h). */
enum { TDT_LT_FIRST = 0, TDT_LT_FEWEST_WAVES = 1, TDT_LT_BY_PRODUCT = 2 };

/* The GEMM schedule's choices that the environment makes (joint.cu): lt_pick, which of
 * cuBLASLt's kernels its products take (TDT_LT_*); wgmma_forward and wgmma_backward, the
 * forward's log-normalisers and the backward's dz on wgmma where the device and the shapes allow
 * (joint_wgmma.h). */
struct joint_gemm_opts {
    int lt_pick, wgmma_forward, wgmma_backward;
};

/* joint_gemm.cu: the GEMM schedule's forward (the node blocks, for the sweeps the caller runs
 * next) or its backward (the four gradients), on the call's stream. */
tdt_status_t tdt_gpu_joint_gemm(const tdt_joint_call_t *call, const tdt_gpu_joint_plan_t *plan, int device,
                                int num_sms, int backward, const joint_gemm_opts &opts);
/* Whether cuBLASLt loaded (the GEMM schedule can run); the default schedule falls back to the
 * tiles where it did not. */
bool tdt_gpu_joint_gemm_available();

#endif /* TDT_GPU_JOINT_COMMON_CUH */
