/*
 * grad.cuh - the fused gradient pass (backward, one kernel): token and duration gradients of
 * sum_b g_b * cost_b, written once, upstream scale included.
 *
 * Math (docs/math.md, section 3, "Gradients"): at node (t, u) inside a feasible sample's lattice,
 * tdt_node_grad() (src/common/lattice.h) turns alpha, beta, LL and the arc weights into the
 * occupancy sums; then per token v, with p = softmax(z)_v = exp(z_v - lse) (p = 0 for
 * log-prob inputs),
 *     grad z(t,u,v) = g_b * tdt_token_grad(node, p, v == blank, v == y_{u+1}, clamp)
 * (for v neither blank nor y_{u+1} that is g_b * clip(p * tok_occ), computed as such),
 * and per duration k, with q = exp(lp_dur(t,u,k)) (0 for log-prob inputs),
 *     grad h(t,u,k) = g_b * tdt_duration_grad(node, q, k).
 * Every other element of the padded (B, maxT, maxU + 1, V or D) extent is written 0: nodes with
 * t >= T_b or u > U_b, every node of an infeasible sample (LL = -inf) and of a sample with bad
 * device data (state BAD_DATA, or lengths out of range, so no lattice index is ever formed).
 *
 * Parallel mapping: as normalize.cu, a group of G lanes per node, grid-striding over all nodes;
 * each lane covers its share of the row in 16-byte vectors, UNROLL of them a batch (a scalar
 * head up to the logits row's first 32-byte boundary, grad_row_align, and a scalar tail),
 * copied into shared memory by cp.async two batches ahead of the one it computes (all but the
 * trail kernel). The node's coefficients are spread over its lanes, each lane the occupancies
 * of a few arc slots, shuffled to all of them (node_grad_group). The row loop writes every
 * element with the bulk formula; the blank and the label are then overwritten by the lane that
 * wrote them (row_owner), with values that lane computed before its loop from the logits the
 * group read before the coefficients. Three
 * kernels share that per-node work (grad_node): grad_kernel takes the nodes in memory order,
 * after the forward's sweeps;
 * grad_ordered_kernel (the split schedule, sweep.cuh) takes them in layers of diagonals from the
 * last one back, each once the beta sweep running beside it has passed (and for the fused schedule
 * from the lattice's middle out, beside both sweeps); grad_trail_kernel (the trail schedule) takes
 * each sample whole once both its sweeps have ended, beside the others'.
 *
 * Race-free, in place included: every gradient element is written by exactly one lane (the
 * blank and label twice, by the same lane, in program order), and that lane has already read
 * the logit at the same position (same thread, load before store) when the gradient aliases
 * the logits; the other lanes of its group read the blank and label logits too, before the
 * group's shuffles (node_grad_group) that come before any store of the row, and discard their
 * copies; nothing else reads the logits in this kernel, and the workspace is read-only
 * here. With options.state_in_grads a node's block (lse, weights) is the head of its own
 * token-gradient row: its group's lanes read it before a __syncwarp that precedes any store of
 * the row, and no other node reads it (the split and fused schedules, whose sweeps read
 * blocks beside this kernel, are not taken then). (The ordered and trail kernels read a
 * sample's sweep values only after an acquire of the count the sweep releases after writing
 * them; their atomics are the ticket counter and the trail's ready flags in shared memory.) No
 * atomics on any value: deterministic, whatever the order.
 *
 * Precision: the node's coefficients in float64 (lattice.h). The bulk of each row, p * occ
 * clipped and scaled, in the accumulate precision (float32; float64 for float64), as the CPU
 * backend does it, with p a base-2 exponential for the float types (tdt_rexp2 in
 * gpu_common.cuh: about 2 ulp, as expf; the rounding of lse's base-2 reference is folded into
 * occ in float64), exp() for float64; rows whose lse is not finite or beyond 1e7 take the
 * natural-unit formula exp(z - lse) one element a lane at a time. The blank and label elements
 * through tdt_token_grad in float64, with p = exp(z - lse) in float64 as the CPU backend has it.
 * Each value is rounded once to the dtype.
 * Gradient stores are 16-byte vectors when the gradient row has the logits row's alignment
 * modulo 16, else scalar (a gradient buffer with other strides still works).
 *
 * Limits: none on V, T, U or B beyond memory; int64 offsets.
 */
#ifndef TDT_GPU_GRAD_CUH
#define TDT_GPU_GRAD_CUH

#include "gpu_common.cuh"

namespace {

const int kThreads = 256;

/* Where the gradient pass splits a row: at its first 32-byte boundary for groups of 8 or more
 * lanes (tdt_row_head<T, ALIGN>), so that a group's 16-byte vectors cover whole L2 sectors, each
 * read once and written once, where the 16-byte split left a row whose vectors start half way
 * into a sector writing that sector's halves in two requests (H200, ncu, large float32: the
 * gradient pass's L2 write sectors 91.5 M -> 86.9 M, 1.57 -> 1.53 ms; f+b 2.70 -> 2.59 ms;
 * docs/performance.md, "The gradient pass"). Groups of 4 (rows of at most 64 vectors) keep the 16-byte split:
 * their lanes would hold up to twice the scalars of the longer head in registers, which
 * spills at 80. */
template <int DT, int G> struct grad_row_align {
    enum { V = G >= 8 ? 32 : 16 };
};

/* Per element type: 16-byte vectors a batch per lane (UNROLL), batches in the shared-memory ring
 * (STAGES: STAGES - 1 batches in flight ahead of the one computed) and blocks per SM (MIN_BLOCKS),
 * the knobs to tune on the device. The ring, against the register batches (H200, tdt_bench f+b ms,
 * same run, docs/performance.md, "The gradient pass"): large float32 3.05-3.08 -> 2.85, bfloat16 2.11 -> 2.03, long
 * float32 3.46 -> 3.18, base float32 0.202 -> 0.199, parakeet unchanged; 4 stages: long 3.19. The
 * trail kernel keeps the register batches (its ring lost ragged 4 %, 0.41 -> 0.425), and so does
 * the per-node pass (normalize.cu: its ring lost 4-14 %, large's forward 0.97 -> 1.11 ms). The row
 * loop is a few instructions an element and the blank and label elements are patched after it (no
 * per-vector test, no inlined special path), so unroll 4 is now about 110 (float32) to 340
 * (bfloat16) PTX instructions a batch; the earlier loop's unrolled special path is what stalled
 * bfloat16 at unroll 4 on instruction fetch. Registers (sm_90): 80
 * for float32 and the 16-bit types (3 blocks, 24 warps an SM; 4 blocks would spill in the node's
 * coefficients), 106-126 for float64. ptxas -v (durations 0..4): no spills for float32 and
 * float64; in grad_kernel and grad_ordered_kernel the 16-bit types spill up to 8 bytes at G = 8
 * and 28-40 at G = 4. */
template <int DT> struct grad_tuning {
    enum { UNROLL = 4, MIN_BLOCKS = DT == TDT_DTYPE_FLOAT64 ? 2 : 3, STAGES = 3 };
};

/* What a gradient node inside its lattice waits for before it reads the sweeps' values (and
 * the sample's state and log-likelihood, which the alpha sweep writes):
 * GS_PLAIN nothing, the forward has ended (or, given `wait`, the split schedule's beta count);
 * GS_FUSED (the fused schedule) alpha past its diagonal d, beta past d + 1, then its sample's
 * cut, whose log-likelihood (ll_cut) it takes;
 * GS_TRAIL (the trail schedule) both sweeps of its sample ended (their final counts). */
enum grad_sched { GS_PLAIN = 0, GS_FUSED = 1, GS_TRAIL = 2 };

/* How deep a ring in shared memory the gradient kernel of schedule MODE reads its rows through
 * (grad_row_vec; 0: none, the trail's), and its launch's dynamic shared memory, `threads`
 * threads a block: each thread's ring of STAGES batches of UNROLL 16-byte vectors (48 KB for
 * grad_kernel's 256 threads, 144 KB for grad_ordered_kernel's 768). The fused schedule's depth
 * is TDT_FUSED_STAGES: 4 and 5 stages did not speed it (H200: parakeet
 * bfloat16 0.555-0.561 ms against 0.553-0.556 at 3). */
#ifndef TDT_FUSED_STAGES /* a define, the knob for benchmark builds */
#define TDT_FUSED_STAGES 3
#endif
template <int DT, int MODE> struct grad_staged {
    enum { STAGES = MODE == GS_TRAIL ? 0 : MODE == GS_FUSED ? TDT_FUSED_STAGES : grad_tuning<DT>::STAGES };
};
template <int DT, int MODE> static inline size_t grad_stage_bytes(int threads) {
    return grad_staged<DT, MODE>::STAGES > 0
               ? tdt_stage_bytes<grad_tuning<DT>::UNROLL, grad_staged<DT, MODE>::STAGES>(threads)
               : 0;
}

/* The lane of a G-lane group that writes element v of a row split as the loops below split it:
 * elements [0, head) and [tail, V) one a lane in turn (head first), the vectors between them
 * one a lane in turn. head = tail = V is the all-scalar split (lane v % G). */
template <int G>
__device__ __forceinline__ int row_owner(int64_t v, int64_t head, int64_t tail, int vec) {
    const int64_t k = v < head ? v : v >= tail ? head + (v - tail) : (v - head) / vec;
    return (int)(k % G);
}

/* Writes 0 over a gradient row, split by the row's own address (row_owner(v, head, tail)). */
template <int DT, int G>
__device__ __forceinline__ void zero_row(typename tdt_elem<DT>::T *g, int64_t V, int lane) {
    typedef typename tdt_elem<DT>::T T;
    const int VEC = tdt_elem<DT>::VEC;
    const int64_t head = tdt_row_head<T, grad_row_align<DT, G>::V>(g, V);
    const int64_t nvec = (V - head) / VEC;
    const int64_t tail = head + nvec * VEC;
    tdt_vec<DT> zv;
#pragma unroll
    for (int e = 0; e < VEC; ++e) zv.v[e] = T(0);
    T *p = g + head + (int64_t)lane * VEC;
    for (int64_t i = lane; i < nvec; i += G, p += G * VEC) zv.store(p);
    for (int64_t k = lane; k < head + (V - tail); k += G) g[k < head ? k : tail + (k - head)] = T(0);
}

/* The bulk of a token-gradient row (every v but the blank and the label, which the caller
 * patches): gpu_common.cuh's row_coef and tdt_row_grad, in the dtype. */
template <int DT, typename X>
__device__ __forceinline__ typename tdt_elem<DT>::T grad_elem(const row_coef<X> &c, typename tdt_elem<DT>::T x) {
    return tdt_elem<DT>::from_acc(tdt_row_grad(c, tdt_elem<DT>::to_acc(x)));
}

/* The row in 16-byte vectors, z and gz with the same alignment modulo 16: the split of
 * row_owner with head and tail from z. Every element is loaded before the same lane stores
 * its gradient (in place safe: with STAGED, a batch's stores come after its copies completed,
 * and the copies in flight beside them are of later batches' elements). STAGES > 0 (grad_kernel,
 * grad_ordered_kernel: grad_staged): whole batches through the thread's cp.async ring of that
 * many (tdt_staged_batches), its dynamic shared memory grad_stage_bytes; else each batch in
 * registers. */
template <int DT, int G, int STAGES, typename X>
__device__ __forceinline__ void grad_row_vec(const typename tdt_elem<DT>::T *z, typename tdt_elem<DT>::T *gz,
                                             int64_t V, int lane, const row_coef<X> &c) {
    typedef typename tdt_elem<DT>::T T;
    const int VEC = tdt_elem<DT>::VEC;
    const int U = grad_tuning<DT>::UNROLL, S = STAGES;
    const int64_t head = tdt_row_head<T, grad_row_align<DT, G>::V>(z, V);
    const int64_t nvec = (V - head) / VEC;
    const int64_t tail = head + nvec * VEC;
    const int64_t mine = lane < nvec ? (nvec - 1 - lane) / G + 1 : 0; /* vectors of this lane */
    /* The scalar head and tail loaded before the vectors, written after them: tdt_row_scalars. */
    const int64_t nscalar = head + (V - tail);
    tdt_row_scalars<T, VEC, G, grad_row_align<DT, G>::V> pre;
    pre.load(z, head, tail, nscalar, lane);
    const T *p = z + head + (int64_t)lane * VEC;
    T *q = gz + head + (int64_t)lane * VEC;
    const auto put = [&](const tdt_vec<DT> &in, T *dst) { /* one vector's gradient */
        tdt_vec<DT> o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = grad_elem<DT>(c, in.v[e]);
        o.store(dst);
    };
    if constexpr (S > 0) {
        const int64_t nb = mine / U, step = (int64_t)U * G * VEC;
        tdt_staged_batches<U, S>(p, nb, step, (int64_t)G * VEC, [&](const uint4 *raw) {
#pragma unroll
            for (int j = 0; j < U; ++j) {
                tdt_vec<DT> in;
                memcpy(in.v, raw + j, 16);
                put(in, q + j * G * VEC);
            }
            q += step;
        });
        p += nb * step;
    } else {
        for (int64_t m = mine / U; m > 0; --m) {
            tdt_vec<DT> buf[U];
#pragma unroll
            for (int j = 0; j < U; ++j) buf[j] = tdt_vec<DT>::load(p + j * G * VEC);
#pragma unroll
            for (int j = 0; j < U; ++j) put(buf[j], q + j * G * VEC);
            p += U * G * VEC;
            q += U * G * VEC;
        }
    }
    /* The last mine % U vectors (fewer than a batch): loaded together, then written, so they
     * cost one memory round trip, not one each (H200, ncu, large float32: 8 % of the pass's
     * stall samples sat on these loads, one after another). */
    const int rem = (int)(mine % U);
    tdt_vec<DT> last[U > 1 ? U - 1 : 1];
#pragma unroll
    for (int j = 0; j < U - 1; ++j)
        if (j < rem) last[j] = tdt_vec<DT>::load(p + j * G * VEC);
#pragma unroll
    for (int j = 0; j < U - 1; ++j)
        if (j < rem) put(last[j], q + j * G * VEC);
#pragma unroll
    for (int i = 0; i < pre.N; ++i) {
        const int64_t k = lane + (int64_t)i * G;
        if (k < nscalar) gz[tdt_row_scalar_at(k, head, tail)] = grad_elem<DT>(c, pre.v[i]);
    }
    for (int64_t k = lane + (int64_t)pre.N * G; k < nscalar; k += G) {
        const int64_t v = tdt_row_scalar_at(k, head, tail);
        gz[v] = grad_elem<DT>(c, z[v]);
    }
}

/* The row one element a lane at a time (split head = tail = V): a gradient buffer whose
 * alignment differs from the logits', and the rows whose lse X cannot hold. */
template <int DT, int G, typename X>
__device__ __noinline__ void grad_row_scalar(const typename tdt_elem<DT>::T *z, typename tdt_elem<DT>::T *gz,
                                             int64_t V, int lane, const row_coef<X> c) {
    for (int64_t v = lane; v < V; v += G) gz[v] = grad_elem<DT>(c, z[v]);
}

/* Gradient of the special token element v (the blank, or the label y) in float64, as the CPU
 * backend computes it; x = z[v] read by the lane that writes v, before its row loop. */
template <int DT>
__device__ __forceinline__ typename tdt_elem<DT>::T special_grad(const tdt_gpu_args_t &a, const tdt_node_grad_t &ng,
                                                                  double lse, double gb, typename tdt_elem<DT>::T x,
                                                                  int is_blank, int is_label) {
    const double p = a.log_probs ? 0.0 : exp((double)tdt_elem<DT>::to_acc(x) - lse);
    return tdt_elem<DT>::from_double(gb * tdt_token_grad(&ng, p, is_blank, is_label, a.clamp));
}

/* The beta sweep of the split schedule publishes sample b's finished steps in p[b]; a node on
 * layer k (diagonal S_b - 1 - k) needs steps 0..k. Every lane of the group polls. */
__device__ __noinline__ void grad_wait(const int32_t *p, int64_t need) {
    while (tdt_ld_acquire(p) < need) __nanosleep(128);
}

/* The fused schedule's wait for a sweep's count of steps. Its tickets run far ahead of the
 * sweeps (a whole half lattice at first), so a group sleeps about the time the steps still
 * missing take, at 256 ns a step (a sweep takes 0.7-1.3 us a step), between 128 ns and 8 us:
 * some 2800 warps then poll a few cache lines about a quarter as often as with a 2 us
 * backoff. (The sweeps publish from about the middle on, so before that a waiter sees 0 and
 * sleeps the longest.) That was a hypothesis for why the sweeps run 20-45 % slower beside the
 * gradient pass (a kernel timeline of the fused schedule); the H200 gave the same times
 * either way, so it is not the polling. */
__device__ __noinline__ int fused_wait(const int32_t *p, int64_t need) { /* returns the count seen */
    for (;;) {
        const int v = tdt_ld_acquire(p);
        const int64_t behind = need - v;
        if (behind <= 0) return v;
        __nanosleep(behind >= 32 ? 8192u : behind <= 1 ? 128u : 256u * (unsigned)behind);
    }
}

/* A wait backing off to 1 us between polls: the fused schedule's for a sample's cut (fus_cut:
 * a count of chunks, then kCutDone), which a node asks for only once the sweeps have passed
 * it, so the cut is done or nearly, and its cut chunks' for the sweeps' counts at the middle;
 * the trail schedule's for a sweep's final count (INT_MAX),
 * which may be a whole sweep away (longest sleeps of 1, 4 and 16 us made no difference there,
 * H200). */
__device__ __noinline__ int wait_backoff(const int32_t *p, int need) { /* returns the count seen */
    unsigned ns = 64;
    int v;
    while ((v = tdt_ld_acquire(p)) < need) {
        __nanosleep(ns);
        ns = ns < 1024 ? 2 * ns : ns;
    }
    return v;
}

/* ---- the counts a block has seen (the fused gradient kernel) ---------------------------------
 * A fused gradient node waits for three counts in global memory, alpha's, beta's and its
 * sample's cut's: three acquires at gpu scope, L2 round trips one after another under the
 * pass's own traffic, that the node's loads wait behind. Where the pass trails the sweeps, the
 * counts a node needs were mostly seen long before by another warp of its block. So
 * grad_ordered_kernel<FUSED> keeps in shared memory, for each kind and each of the batch's first
 * kSeenSamples samples, the highest count a thread of the block has read (raised by
 * tdt_max_release_block after its acquire), where the plan says so (fus_seen: sweep.cuh,
 * kSeenBytesPerDiagonal); a node whose needs those meet reads them (tdt_ld_acquire_block) and
 * no global count. Lane 0 of the group reads and raises the words (one shared atomic a word,
 * not one a lane on one address) and tells the others; the warp barrier after it orders their
 * reads after its acquires. What the raising thread's acquire made visible is then visible to
 * the node's lanes, as with the trail's ready flags. */
#ifndef TDT_SEEN_SAMPLES /* a define, the knob for benchmark builds (0: no cache) */
#define TDT_SEEN_SAMPLES 64
#endif
const int kSeenSamples = TDT_SEEN_SAMPLES;
enum seen_kind { SEEN_ALPHA = 0, SEEN_BETA = 1, SEEN_CUT = 2, SEEN_KINDS = 3 };

/* The block's seen word for count `kind` of sample b, or NULL (no cache, or b past it). */
__device__ __forceinline__ int32_t *seen_word(int32_t *seen, int kind, int64_t b) {
    return seen && b < kSeenSamples ? seen + kind * kSeenSamples + b : (int32_t *)0;
}

/* Whether the block has seen each word w[i] reach need[i] (w[0] NULL: no cache, none of them),
 * for the whole group: group-uniform. */
template <int G, int N>
__device__ __forceinline__ bool seen_met(int32_t *const (&w)[N], const int64_t (&need)[N], int lane) {
    if (!w[0]) return false;
    int met = 1;
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; ++i) met &= tdt_ld_acquire_block(w[i]) >= need[i];
    met = __shfl_sync(tdt_group_mask<G>(), met, 0, G);
    if (met) __syncwarp(tdt_group_mask<G>());
    return met != 0;
}

/* Until *p >= need (fused_wait, or wait_backoff with BACKOFF; every lane), then the count read
 * raised in the block's word (NULL: none). */
template <bool BACKOFF>
__device__ __forceinline__ void seen_poll(const int32_t *p, int64_t need, int32_t *word, int lane) {
    const int v = BACKOFF ? wait_backoff(p, (int)need) : fused_wait(p, need);
    if (word && lane == 0) tdt_max_release_block(word, v);
}

/* ---- the middle cut's log-likelihood (the fused schedule) -------------------------------------
 * lattice.h, tdt_mid_cut: the fused schedule's gradients take log p(y|x) from the arcs across
 * the middle of each lattice, which both sweeps have passed long before the alpha sweep ends.
 * The cut's terms leave the span diagonals below it: that window, dlen node slots w a diagonal,
 * each with its nsl arc slots j, is dealt term by term to TDT_WS_CUT_CHUNKS chunks (term z = w
 * nsl + j to chunk (z / 32) mod chunks, lane z mod 32), each a warp's ticket. A lane adds its
 * terms one at a time (the online log-sum-exp: one exp a term) into a (max, sum) pair; the warp
 * merges its lanes' pairs (xor butterfly); lane 0 keeps the chunk's pair in the workspace and
 * counts it in fus_cut[b]; the warp whose chunk completes the count merges the sample's pairs,
 * chunk i in lane i, by the same butterfly, writes ll_cut[b] and releases fus_cut[b] =
 * kCutDone. So the value is one fixed order of operations whichever warp finishes last:
 * deterministic. The merge spells out its roundings (no FMA contraction) and is symmetric in
 * its two pairs, so both lanes of a butterfly step get the same bits.
 * This is the fused schedule's path from the sweeps' middle to its first gradient node. Before
 * this form (H200 timelines, parakeet bfloat16: 30-35 us from the first chunk to the last merge)
 * a lane took whole node slots, its ten terms in a row, each term's loads behind the previous
 * term's exp (parakeet: 205 node slots, so 7 busy chunks), and lane 0 merged the 32 pairs alone,
 * 64 exps in a row; now parakeet's 2050 terms are two a lane. Forming a node slot's terms
 * together instead (unrolled, loads at once) made the gradient kernel spill (ptxas allocates
 * across the call). */
const int kCutDone = 2 * TDT_WS_CUT_CHUNKS;
static_assert(TDT_WS_CUT_CHUNKS == 32, "the final merge holds a chunk a lane");

struct lse_pair {
    double m, s; /* log-sum-exp = m + log(s); s = 0 where m = -inf */
};

__device__ __forceinline__ lse_pair lse_merge(const lse_pair &x, const lse_pair &y) {
    lse_pair r;
    r.m = tdt_lse_max(x.m, y.m);
    r.s = r.m == -TDT_INF ? 0.0
                          : __dadd_rn(__dmul_rn(x.s, exp(x.m - r.m)), __dmul_rn(y.s, exp(y.m - r.m)));
    return r;
}

/* Warp-wide: every lane's pair merged over the warp (xor butterfly; every lane the same bits). */
__device__ __forceinline__ lse_pair lse_warp_merge(lse_pair p) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        lse_pair y;
        y.m = __shfl_xor_sync(0xffffffffu, p.m, o);
        y.s = __shfl_xor_sync(0xffffffffu, p.s, o);
        p = lse_merge(p, y);
    }
    return p;
}

/* The arcs as cut_chunk takes them: for a fixed count (KD > 0) only its KD durations a kind, 2
 * KD + 1 words where a tdt_arcs_t is 66 (passed by value to a function that is not inlined, the
 * whole struct went through the gradient kernel's registers: ptxas spilled 110-130 bytes of its
 * node at 768 threads, 0-40 with these); a runtime count (generic.cu) the whole struct. */
template <int KD> struct cut_arcs {
    int use_dur, label_dur[KD], blank_dur[KD];
    __device__ __forceinline__ explicit cut_arcs(const tdt_arcs_t &A) : use_dur(A.use_dur) {
#pragma unroll
        for (int k = 0; k < KD; ++k) {
            label_dur[k] = A.label_dur[k];
            blank_dur[k] = A.blank_dur[k];
        }
    }
    __device__ __forceinline__ tdt_arcs_t unpack() const {
        tdt_arcs_t A;
        A.count = KD;
        A.use_dur = use_dur;
#pragma unroll
        for (int k = 0; k < KD; ++k) {
            A.label_dur[k] = label_dur[k];
            A.blank_dur[k] = blank_dur[k];
        }
        return A;
    }
};
template <> struct cut_arcs<0> {
    tdt_arcs_t A;
    __device__ __forceinline__ explicit cut_arcs(const tdt_arcs_t &in) : A(in) {}
    __device__ __forceinline__ tdt_arcs_t unpack() const { return A; }
};

/* Warp-wide: chunk ck of the cut terms of a sample's lattice L (alpha, beta: its arrays; ok 0:
 * a sample with bad labels, no terms), merged over the warp, kept in part[2 ck], part[2 ck +
 * 1] (part: the sample's chunk pairs) and counted in *done; the warp that completes the count
 * merges the sample's pairs, chunk i in lane i, into its log-likelihood *ll and releases
 * *done = kCutDone. Not inlined, and pointers only (a reference to the kernel's arguments would
 * copy them to local memory): one call in the gradient kernel, which spilled when the final
 * merge was inlined into it. */
template <int KD>
__device__ __noinline__ void cut_chunk(const tdt_lattice_t L, const cut_arcs<KD> arcs, const double *alpha,
                                       const double *beta, int ck, int ok, double *part, double *ll,
                                       int32_t *done, unsigned long long *tl) {
    const tdt_arcs_t A = arcs.unpack();
    const int lane = threadIdx.x & 31;
    const int64_t S = L.T + L.U, c = tdt_mid_cut(S), span = tdt_arcs_span(&A);
    const int64_t s0 = c > span ? c - span : 0, dlen = L.T < L.U + 1 ? L.T : L.U + 1;
    const int nsl = tdt_num_slots(&A);
    const int64_t nz = ok ? (c - s0) * dlen * nsl : 0;
    lse_pair p = {-TDT_INF, 0.0};
#pragma unroll 1
    for (int64_t z = (int64_t)ck * 32 + lane; z < nz; z += 32 * TDT_WS_CUT_CHUNKS) {
        const int64_t w = z / nsl;
        const int64_t s = s0 + w / dlen;
        int64_t lo, hi;
        tdt_diagonal_range(&L, s, &lo, &hi);
        const int64_t u = lo + w % dlen;
        if (u > hi) continue;
        const tdt_slot_t q = tdt_slot_of(&A, (int)(z - w * nsl));
        const double x = tdt_cut_slot_term(&L, &A, alpha, beta, &q, s - u, u, c);
        if (x > p.m) { /* online: rescale the sum to the new max */
            p.s = __dadd_rn(__dmul_rn(p.s, exp(p.m - x)), 1.0);
            p.m = x;
        } else if (x != -TDT_INF) { /* NaN included: the sum turns NaN */
            p.s = __dadd_rn(p.s, exp(x - p.m));
        }
    }
    p = lse_warp_merge(p);
    int last = 0;
    if (lane == 0) {
        part[2 * ck] = p.m;
        part[2 * ck + 1] = p.s;
        __threadfence();
        last = atomicAdd(done, 1) == TDT_WS_CUT_CHUNKS - 1; /* the sample's last chunk */
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return; /* warp-uniform */
    __threadfence(); /* after the count that said every chunk's pair is there */
    lse_pair r = {__ldcg(part + 2 * lane), __ldcg(part + 2 * lane + 1)};
    r = lse_warp_merge(r);
    if (lane == 0) {
        *ll = tdt_lse_finish_log(r.m, log(r.s));
        tdt_st_release(done, kCutDone); /* fences itself */
        tdt_tl_end(tl, TDT_TL_CUT + 1);
    }
}

/* Warp-wide: cut ticket id = chunk id % chunks of sample id / chunks, once both sweeps have
 * passed the cut (the sweeps publish those two counts: staged_sweep). Samples with no lattice
 * (lengths out of range, T_b = 0) have no chunks: no gradient node of theirs waits for a cut. A
 * sample with bad labels (state BAD_DATA, written before its alpha count went up) counts its
 * chunks without terms. */
template <int KD>
__device__ __forceinline__ void cut_ticket(const tdt_gpu_args_t &a, const tdt_arcs_t &A, int64_t id) {
    const int64_t b = id / TDT_WS_CUT_CHUNKS;
    const int ck = (int)(id - b * TDT_WS_CUT_CHUNKS);
    int64_t Tb, Ub;
    if (!tdt_sample_lengths(a, b, &Tb, &Ub) || Tb == 0) return;
    const int64_t S = Tb + Ub, c = tdt_mid_cut(S); /* S < 2^31: fused_plan's bound on the tickets */
    /* alpha of diagonals 0 .. c - 1, beta of diagonals c .. S - 1: polled at least every 1 us
     * (fused_wait sleeps 8 us while the sweeps have published nothing, and the cut is the
     * first gradient node's wait: B * 32 warps poll) */
    wait_backoff(a.fus_alpha + b, (int)c);
    wait_backoff(a.bwd_progress + b, (int)(S - c));
    if ((threadIdx.x & 31) == 0) tdt_tl_start(a.tl, TDT_TL_CUT);
    const int64_t off = tdt_sample_offset(b, a.maxT, a.row);
    cut_chunk<KD>(tdt_sample_lattice(a, b, Tb, Ub), cut_arcs<KD>(A), a.ws.alpha + off, a.ws.beta + off, ck,
                  a.ws.state[b] == TDT_GPU_STATE_OK, a.ws.cut_part + 2 * b * TDT_WS_CUT_CHUNKS,
                  a.ws.ll_cut + b, a.fus_cut + b, a.tl);
    __syncwarp();
}

/* Gradient coefficients of node (t, u) (tdt_node_grad), its G lanes together: lane l computes
 * the occupancies of slots l, l + G, ... (tdt_slot_occupancy: each slot's loads issue with
 * alpha's), the group's shuffles give every lane all of them, and every lane sums them in arc
 * order (tdt_node_grad_of): the same operations as the CPU's, the same bits for any G. Before,
 * each lane of the group computed all of a node's slots itself, one after another; that was
 * over half the gradient pass's warp time (ncu stall samples, H200: large float32 54 %,
 * parakeet bfloat16 55 %; docs/performance.md, "The gradient pass"), with the row's loads not yet asked for.
 * mask: the group's lanes (tdt_group_mask), which all reach this together. */
template <int G, int KD>
__device__ __forceinline__ void node_grad_group(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                                const tdt_arcs_t &arcs, const double *alpha,
                                                const double *beta, int64_t t, int64_t u,
                                                double ll, double fastemit_lambda, int lane,
                                                unsigned mask, tdt_node_grad_t *g) {
    if constexpr (KD == 0) { /* a runtime count (generic.cu): up to 64 slots, each lane all */
        tdt_node_grad(&L, &A, alpha, beta, t, u, ll, fastemit_lambda, g);
    } else {
        enum { SLOTS = 2 * KD, PER = (SLOTS + G - 1) / G };
        const double a = alpha[tdt_node_index(L.frames, L.row, t, u)];
        double mine[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            /* the slot from the kernel's parameters (arcs: a.arcs), which an index known only
             * at run time reads from the constant bank; A's copy of them would go to local
             * memory. Past SLOTS: no arc, no load. */
            const tdt_slot_t q = tdt_slot_of(&arcs, lane + i * G);
            mine[i] = tdt_slot_occupancy(&L, &A, beta, &q, t, u, a, ll);
        }
        double occ[SLOTS];
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) occ[j] = __shfl_sync(mask, mine[j / G], j % G, G);
        tdt_node_grad_of(occ, KD, fastemit_lambda, g);
    }
}

/* Zeros over node (b, t, u)'s gradient rows: outside the lattices, or no gradient there. */
template <int DT, int G>
__device__ __forceinline__ void zero_node(const tdt_gpu_args_t &a, int64_t b, int64_t t, int64_t u, int lane) {
    typedef typename tdt_elem<DT>::T T;
    if (a.tok_g) zero_row<DT, G>(static_cast<T *>(a.tok_g) + tdt_row_offset(a.tok_gs, b, t, u), a.V, lane);
    if (a.dur_g && a.D > 0) {
        T *gh = static_cast<T *>(a.dur_g) + tdt_row_offset(a.dur_gs, b, t, u);
        for (int k = lane; k < a.D; k += G) gh[k] = T(0);
    }
}

/* The trail schedule's wait for both sweeps of a sample to have ended (their final counts in
 * alpha and beta). ready: the sample's flag in the block's shared memory, raised by the first
 * of its threads to see both counts, so the others skip the two polls of global memory (two L2
 * round trips a node). Pointers only: a reference to the kernel's arguments here would copy
 * them to local memory. */
__device__ __noinline__ void trail_wait(const int32_t *alpha, const int32_t *beta, int32_t *ready) {
    if (tdt_ld_acquire_block(ready)) return;
    wait_backoff(alpha, INT_MAX);
    wait_backoff(beta, INT_MAX);
    tdt_st_release_block(ready, 1);
}

/* Node (b, t, u)'s gradient rows (every node of the padded extent, inside a lattice or not),
 * the G lanes of a group together, once what MODE names is there (grad_sched). wait: for
 * GS_PLAIN the split schedule's beta progress (NULL: beta is in the workspace already), and
 * only a node whose gradient reads beta waits, for `need` steps; for GS_TRAIL the block's
 * ready flags (trail_wait). seen: for GS_FUSED the counts its block has seen (seen_word; NULL:
 * no cache). */
template <int DT, int G, int KD, int MODE = GS_PLAIN>
__device__ __forceinline__ void grad_node(const tdt_gpu_args_t &a, const tdt_arcs_t &A, int64_t b,
                                          int64_t t, int64_t u, int lane, int32_t *wait,
                                          int need, int32_t *seen = (int32_t *)0) {
    typedef tdt_elem<DT> E;
    typedef typename E::T T;
    typedef typename E::Acc Acc;
    typedef typename tdt_rexp_fast<DT>::X XF;     /* the row loop's units */
    typedef tdt_rexp_nat<DT> XN;                  /* rows whose lse XF cannot hold */
    const int VEC = E::VEC;
    const T *tok = static_cast<const T *>(a.tok);
    T *tok_g = static_cast<T *>(a.tok_g);
    T *dur_g = a.D > 0 ? static_cast<T *>(a.dur_g) : (T *)0;
    const int D = a.D;
    const int64_t V = a.V;
    int64_t Tb, Ub;
    T *gz = tok_g ? tok_g + tdt_row_offset(a.tok_gs, b, t, u) : (T *)0;
    T *gh = dur_g ? dur_g + tdt_row_offset(a.dur_gs, b, t, u) : (T *)0;

    /* The per-sample values depend only on b: issue their loads together (one memory
     * round trip, not three dependent ones). b < B, so each read is in bounds. */
    const int lengths_ok = tdt_sample_lengths(a, b, &Tb, &Ub);
    /* every sample with lengths in range publishes its counts, bad labels included; the state,
     * ll and ll_cut are read after these acquires */
    if (MODE == GS_FUSED && lengths_ok && t < Tb && u <= Ub) {
        /* alpha past diagonal d = t + u and beta past d + 1, then the cut */
        int32_t *const w[3] = {seen_word(seen, SEEN_ALPHA, b), seen_word(seen, SEEN_BETA, b),
                               seen_word(seen, SEEN_CUT, b)};
        const int64_t need3[3] = {t + u + 1, Tb + Ub - 1 - (t + u), kCutDone};
        if (!seen_met<G, 3>(w, need3, lane)) {
            seen_poll<false>(a.fus_alpha + b, need3[0], w[0], lane);
            seen_poll<false>(a.bwd_progress + b, need3[1], w[1], lane);
            seen_poll<true>(a.fus_cut + b, kCutDone, w[2], lane);
        }
        if (lane == 0 && t + u + 1 == tdt_mid_cut(Tb + Ub)) tdt_tl_start(a.tl, TDT_TL_NODE); /* a first layer's */
    }
    if (MODE == GS_TRAIL && lengths_ok && t < Tb && u <= Ub)
        trail_wait(a.fus_alpha + b, a.bwd_progress + b, wait + b);
    const int32_t state = a.ws.state[b];
    const double ll = MODE == GS_FUSED ? a.ws.ll_cut[b] : a.ws.ll[b];
    const double gb = tdt_upstream(a.grad_costs, a.acc_double, a.grad_costs_scalar, b,
                                   a.batch_mean ? a.B : 0, a.normalize_costs, lengths_ok ? Ub : 1);
    if (!lengths_ok || state != TDT_GPU_STATE_OK || ll == -TDT_INF || t >= Tb || u > Ub) {
        zero_node<DT, G>(a, b, t, u, lane); /* group-uniform: outside the lattice, infeasible, or bad data */
        return;
    }
    if (MODE == GS_PLAIN && wait) grad_wait(wait + b, need);
    /* The trail schedule's rows (short ones: ragged's) in registers, not staged: the row's
     * first lines (lane l asks for its l-th 128 bytes: together the group's first batch) and
     * its blank and label elements are asked into L1 now, so that their memory latency runs
     * beside the node's coefficients (tdt_node_grad: its loads and exps) rather than after
     * them. (Not in the staged kernels: at 80 registers the row pointer held across
     * tdt_node_grad spills there.) */
    const T *zr = MODE == GS_TRAIL && tok_g && !a.log_probs ? tok + tdt_row_offset(a.tok_s, b, t, u) : (const T *)0;
    if (zr) {
        if ((int64_t)lane * 128 < V * (int64_t)sizeof(T))
            tdt_prefetch_l1(reinterpret_cast<const char *>(zr) + lane * 128);
        if (lane == 0) tdt_prefetch_l1(zr + a.blank);
    }
    const tdt_lattice_t L = tdt_sample_lattice(a, b, Tb, Ub);
    const int64_t off = tdt_sample_offset(b, a.maxT, a.row);
    const double *const w = tdt_node_block(&L, t, u); /* the node's block (workspace.h) */
    const double lse = w[tdt_w_lse(a.D)];
    const int32_t y = u < Ub ? a.labels[b * a.maxU + u] : -1; /* compared; indexed only in [0, V) */
    if (zr && lane == 0 && y >= 0 && y < V) tdt_prefetch_l1(zr + y);
    /* The blank and the label logits, read now by every lane of the group (one address each:
     * a broadcast) so that their memory latency runs beside the coefficients' rather than
     * after them; the lane that writes each of them uses its copy. y == blank (bad data, never
     * reached here) would take both terms at one element. */
    const int64_t vb = a.blank, vy = (y >= 0 && y < V && y != a.blank) ? y : -1;
    T xb = T(0), xy = T(0);
    if (gz) {
        const T *z = tok + tdt_row_offset(a.tok_s, b, t, u);
        xb = z[vb];
        if (vy >= 0) xy = z[vy];
    }
    tdt_node_grad_t ng;
    node_grad_group<G, KD>(L, A, a.arcs, a.ws.alpha + off, a.ws.beta + off, t, u, ll,
                           a.fastemit_lambda, lane, tdt_group_mask<G>(), &ng);

    if (gh) { /* first, so the per-arc occupancies are dead before the token row */
        /* lane l computes duration k = l (k known at compile time in each unrolled step, so
         * the node's arrays stay in registers) and the group stores them in one instruction:
         * one request for the row's few contiguous elements, where a store for each k made D
         * requests (measured with grad_row_align's split). Groups of fewer lanes than
         * durations store each k as it comes. */
        enum { KMAX = KD > 0 ? KD : TDT_MAX_DURATIONS };
        const double *lpd = w + TDT_W_DUR;
        T gd = T(0);
#pragma unroll
        for (int k = 0; k < KMAX; ++k) {
            if (k < D && (k % G) == lane) {
                double q = a.log_probs ? 0.0 : exp(lpd[k]);
                const T g = E::from_double(gb * tdt_duration_grad(&ng, q, k));
                if (G >= KMAX) gd = g;
                else gh[k] = g;
            }
        }
        if (G >= KMAX && lane < D) gh[lane] = gd;
    }

    if (gz) {
        /* options.state_in_grads: the node's block is the head of this row; every lane of the
         * group has read its part of it (lse, the duration log-probs, its slots' weights)
         * before any lane writes the row. */
        if (a.state_rows) __syncwarp(tdt_group_mask<G>());
        const T *z = tok + tdt_row_offset(a.tok_s, b, t, u);
        /* How the row is split (row_owner): by the gradient's address when zeroing
         * (log-prob inputs), by the logits' when both share an alignment modulo 16, one
         * element a lane otherwise and for rows whose lse the fast units cannot hold. */
        const bool fast = !a.log_probs && XF::fits(lse) && lse == lse;
        const bool same16 = (((uintptr_t)gz ^ (uintptr_t)z) & 15u) == 0;
        int64_t head = V, tail = V;
        if (a.log_probs || (fast && same16)) {
            head = tdt_row_head<T, grad_row_align<DT, G>::V>(a.log_probs ? (const T *)gz : z, V);
            tail = head + (V - head) / VEC * VEC;
        }
        /* The blank and the label (read above, before the row loop overwrites them in
         * place), patched after it by the lane that owns them in this split. */
        const bool own_b = row_owner<G>(vb, head, tail, VEC) == lane;
        const bool own_y = vy >= 0 && row_owner<G>(vy, head, tail, VEC) == lane;
        T gsb = T(0), gsy = T(0);
        if (own_b) gsb = special_grad<DT>(a, ng, lse, gb, xb, 1, y == a.blank);
        if (own_y) gsy = special_grad<DT>(a, ng, lse, gb, xy, 0, 1);

        const Acc cl = a.clamp > 0.0 ? (Acc)a.clamp : (Acc)INFINITY;
        if (a.log_probs) {
            zero_row<DT, G>(gz, V, lane);
        } else if (fast) {
            const row_coef<XF> c = tdt_row_coef<XF>(lse, ng.tok_occ, cl, gb);
            if (same16) grad_row_vec<DT, G, grad_staged<DT, MODE>::STAGES>(z, gz, V, lane, c);
            else grad_row_scalar<DT, G>(z, gz, V, lane, c);
        } else {
            /* the previous formula: exp(z - lse) in the accumulate precision */
            const row_coef<XN> c = tdt_row_coef<XN>(lse, ng.tok_occ, cl, gb);
            grad_row_scalar<DT, G>(z, gz, V, lane, c);
        }
        if (own_b) gz[vb] = gsb;
        if (own_y) gz[vy] = gsy;
    }
}

/* Every node of the padded extent in memory order, grid-striding. */
template <int DT, int G, int KD>
__global__ void __launch_bounds__(kThreads, grad_tuning<DT>::MIN_BLOCKS) grad_kernel(const tdt_gpu_args_t a) {
    const int lane = threadIdx.x & (G - 1);
    const int64_t groups = (int64_t)gridDim.x * (kThreads / G);
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    if (threadIdx.x == 0) tdt_tl_start(a.tl, TDT_TL_GRAD);
    for (int64_t n = (int64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; n < a.nodes;
         n += groups) {
        int64_t b, t, u;
        tdt_decode_node(a, n, &b, &t, &u);
        grad_node<DT, G, KD>(a, A, b, t, u, lane, NULL, 0);
    }
    if (threadIdx.x == 0) tdt_tl_end(a.tl, TDT_TL_GRAD + 1);
}

/* Threads of a block of grad_ordered_kernel: one block fills an SM's registers (the row loop's
 * 80 registers a thread, 24 warps an SM as grad_kernel's 3 blocks; float64 up to 126), so its
 * blocks take the SMs the beta sweep leaves free. The fused schedule's (FUSED) takes 512: at
 * 768 its node (the sweeps' counts and the cut waited for) spilled 120-150 bytes a thread at
 * the cap of 80 registers (ptxas -v), at 640 still 60-70; at 512, 114-128 registers and no
 * spill. H200, f+b ms, 512 against 768, timeline builds (docs/performance.md, "Tried and dropped"):
 * parakeet bfloat16 under FUSED 0.557 / 0.593, float32 0.918 / 0.959, base float32 0.165 /
 * 0.178; long (AUTO: fused) float32 2.995 / 3.117, bfloat16 2.526 / 2.602.
 * TDT_FUSED_THREADS (a define) is the knob for benchmark builds. */
#ifndef TDT_FUSED_THREADS
#define TDT_FUSED_THREADS 512
#endif
/* Built for sm_90 alone: grad_ordered_kernel and grad_trail_kernel are the programmatic
 * dependents of the overlapped schedules, which run only where the sweep's code is sm_90's
 * (sweep.cuh: sm90_code, in overlap_plan and trail_plan; every kernel of a build comes from the
 * same architecture list). In the code for older architectures their bodies are left out (a
 * launch there would trap); the other kernels' code is unchanged (the same PTX). nvcc's time
 * for grad.cu, grad_fused.cu and grad_trail.cu at sm_80 went from 121 s to 27 s (one core of
 * the Zen 5 VM, nvcc 13.0), for each of the four architectures before sm_90. */
template <int DT, bool FUSED = false> struct grad_ordered {
    enum { THREADS = DT == TDT_DTYPE_FLOAT64 ? 512 : FUSED ? TDT_FUSED_THREADS : 768 };
};

/* The same rows in the order the split schedule's beta sweep finishes them (sweep.cuh, "The
 * overlapped schedules"), as its programmatic dependent: first the rows outside every lattice
 * (zeros, waiting on nothing, grid-striding); then layer k = diagonal S_b - 1 - k of every
 * sample, in tickets of a warp from order[0] (tdt_ticket_loop), a.bwd_tickets a layer, each node once
 * beta has reached its diagonal. Ends with griddepcontrol.wait: the beta sweep has ended too
 * when this kernel has.
 * FUSED (sweep.cuh, "The fused schedule"): the programmatic dependent of both sweeps; its
 * tickets (from fus_ticket) are first the cut chunks (fus_cut_layers layers' worth, a warp
 * each), then the layers from the middle of each lattice out: layer k = diagonals L_b - 1 - k
 * and S_b - L_b + k (tdt_layer_node, ends 2, rev 1), in the order the sweeps finish them. */
template <int DT, int G, int KD, bool FUSED>
__global__ void __launch_bounds__(grad_ordered<DT, FUSED>::THREADS, 1) grad_ordered_kernel(const tdt_gpu_args_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    (void)a;
    __trap(); /* not compiled before sm_90: see "Built for sm_90 alone" above */
#else
    enum { THREADS = grad_ordered<DT, FUSED>::THREADS, PER = THREADS / G };
    const int lane = threadIdx.x & (G - 1);
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    /* the counts the block has seen (FUSED, where the plan says so) */
    __shared__ int32_t seen_counts[SEEN_KINDS * (kSeenSamples > 0 ? kSeenSamples : 1)];
    int32_t *const seen = FUSED && kSeenSamples > 0 && a.fus_seen ? seen_counts : (int32_t *)0;
    if (seen) {
        for (int i = threadIdx.x; i < SEEN_KINDS * kSeenSamples; i += THREADS) seen[i] = 0;
        __syncthreads(); /* block-uniform: the kernel's arguments */
    }
    if (threadIdx.x == 0) tdt_tl_start(a.tl, TDT_TL_GRAD);
    for (int64_t n = (int64_t)blockIdx.x * PER + threadIdx.x / G; n < a.nodes;
         n += (int64_t)gridDim.x * PER) {
        int64_t b, t, u, Tb, Ub;
        tdt_decode_node(a, n, &b, &t, &u);
        if (tdt_sample_lengths(a, b, &Tb, &Ub) && t < Tb && u <= Ub) continue; /* a layer's */
        zero_node<DT, G>(a, b, t, u, lane);
    }
    if (FUSED) {
        const int64_t slots = 2 * a.B * a.fwd_dlen; /* a layer's */
        const int L0 = a.fus_cut_layers;
        tdt_ticket_loop<G>(
            a.fus_ticket, (L0 + (int)a.fwd_layers) * a.bwd_tickets /* fits: fused_plan */,
            a.bwd_tickets,
            [&](int64_t k, int64_t q) {
                if (k < L0) { /* warp-uniform: a cut chunk */
                    const int64_t id = k * a.bwd_tickets + q / (32 / G);
                    if (id < a.B * TDT_WS_CUT_CHUNKS) cut_ticket<KD>(a, A, id);
                    return;
                }
                int64_t b, t, u, Ub;
                if (q < slots && tdt_layer_node(a, k - L0, q, 2, 1, &b, &t, &u, &Ub))
                    grad_node<DT, G, KD, GS_FUSED>(a, A, b, t, u, lane, NULL, 0, seen);
            },
            [](int) {});
    } else {
        const int64_t slots = a.B * a.fwd_dlen; /* a layer's */
        tdt_ticket_loop<G>(
            a.ws.order, (int)a.fwd_layers * a.bwd_tickets /* fits: split_plan */, a.bwd_tickets,
            [&](int64_t k, int64_t q) {
                int64_t b, t, u, Ub;
                if (q < slots && tdt_layer_node(a, k, q, 1, 1, &b, &t, &u, &Ub)) /* group-uniform */
                    grad_node<DT, G, KD>(a, A, b, t, u, lane, a.bwd_progress, (int)k + 1);
            },
            [](int) {});
    }
    if (threadIdx.x == 0) tdt_tl_end(a.tl, TDT_TL_GRAD + 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#endif /* sm_90 code */
}

/* ---- the trail schedule's gradient pass (sweep.cuh, "The trail schedule") --------------------
 * The programmatic dependent of a serial forward's sweeps in a one-shot call: it takes each
 * sample's lattice nodes once both of that sample's sweeps have ended, beside the sweeps of the
 * others, so a batch of ragged lengths has most of its gradient written by the time the
 * longest sample's sweeps end. Its tickets (from *fus_ticket, a warp each, warp-uniform) are
 * first the rows outside every lattice in memory order, kTrailZeroRows node slots a group,
 * waiting on nothing; then the lattices' nodes, sample after sample in the order the sweeps
 * end them: S_b = T_b + U_b ascending (both sweeps of every sample start together and take
 * about the same time a diagonal), ties by b, each sample's nodes in memory order. Each block
 * ranks the samples itself (B <= TDT_TRAIL_MAX_BATCH: trail_plan), in shared memory. Every node is
 * grad_node's, on the values the serial schedule's gradient pass reads: the same bits. */
const int kTrailZeroRows = 8;

/* Threads of a block of grad_trail_kernel: 640, not grad_ordered's 768, whose cap of 80
 * registers a thread makes ptxas spill 8 bytes of the trail's loop (ncu: 154 K local
 * requests at 40,150,60,257); at 640 it takes 92-95 and spills none. H200 (docs/performance.md,
 * "Tried and dropped"): ragged float32 f+b 0.413-0.419 -> 0.405-0.408 ms; 576 threads 0.408; blocks of 320 (two
 * an SM, one beside a sweep's block) 0.407-0.409, of 224 (three) 0.444-0.450. The split's
 * grad_ordered_kernel stays at 768: large float32 3.05 -> 3.14-3.15 at 640. */
template <int DT> struct grad_trail {
    enum { THREADS = DT == TDT_DTYPE_FLOAT64 ? 512 : 640 };
};

template <int DT, int G, int KD>
__global__ void __launch_bounds__(grad_trail<DT>::THREADS, 1) grad_trail_kernel(const tdt_gpu_args_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    (void)a;
    __trap(); /* not compiled before sm_90: see "Built for sm_90 alone" above */
#else
    enum { THREADS = grad_trail<DT>::THREADS, PER = 32 / G /* node slots a ticket */ };
    __shared__ int32_t key[TDT_TRAIL_MAX_BATCH];        /* sample -> S_b, -1 without a lattice */
    __shared__ int64_t count[TDT_TRAIL_MAX_BATCH];      /* sample -> its lattice's nodes */
    __shared__ int32_t order[TDT_TRAIL_MAX_BATCH];      /* rank -> sample */
    __shared__ int64_t first[TDT_TRAIL_MAX_BATCH + 1];  /* rank -> its first slot; [B]: all slots */
    __shared__ int32_t ready[TDT_TRAIL_MAX_BATCH];      /* sample -> both sweeps seen ended */
    const int lane = threadIdx.x & (G - 1);
    const int B = (int)a.B;
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    if (threadIdx.x == 0) tdt_tl_start(a.tl, TDT_TL_GRAD);
    for (int b = threadIdx.x; b < B; b += THREADS) {
        int64_t Tb, Ub;
        const bool lattice = tdt_sample_lengths(a, b, &Tb, &Ub) && Tb > 0;
        key[b] = lattice ? (int32_t)(Tb + Ub) : -1;
        count[b] = lattice ? Tb * (Ub + 1) : 0;
        ready[b] = 0;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < B; b += THREADS) { /* rank b among (S_c, c) ascending */
        const int32_t kb = key[b];
        int r = 0;
        int64_t f = 0;
        for (int c = 0; c < B; ++c) {
            if (key[c] < kb || (key[c] == kb && c < b)) {
                ++r;
                f += count[c];
            }
        }
        order[r] = b;
        first[r] = f;
        if (r == B - 1) first[B] = f + count[b];
    }
    __syncthreads();
    const int64_t zero_tickets = (a.nodes + PER * kTrailZeroRows - 1) / (PER * kTrailZeroRows);
    const int64_t slots = first[B];
    const int total = (int)(zero_tickets + (slots + PER - 1) / PER); /* fits: trail_plan */
    tdt_ticket_loop<G>(
        a.fus_ticket, total, total > 0 ? total : 1 /* one layer */,
        [&](int64_t, int64_t q) {
            const int64_t tk = q / PER, grp = q - tk * PER;
            if (tk < zero_tickets) { /* warp-uniform */
                for (int j = 0; j < kTrailZeroRows; ++j) {
                    const int64_t n = (tk * kTrailZeroRows + j) * PER + grp;
                    int64_t b, t, u, Tb, Ub;
                    if (n >= a.nodes) break;
                    tdt_decode_node(a, n, &b, &t, &u);
                    if (!(tdt_sample_lengths(a, b, &Tb, &Ub) && t < Tb && u <= Ub))
                        zero_node<DT, G>(a, b, t, u, lane);
                }
                return;
            }
            const int64_t s = q - zero_tickets * PER; /* a lattice slot */
            if (s >= slots) return;
            int lo = 0, hi = B - 1; /* the last rank whose first slot is at or before s */
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (first[mid] <= s) lo = mid;
                else hi = mid - 1;
            }
            const int64_t b = order[lo], n = s - first[lo];
            int64_t Tb, Ub;
            (void)tdt_sample_lengths(a, b, &Tb, &Ub); /* in range: count[b] > 0 */
            grad_node<DT, G, KD, GS_TRAIL>(a, A, b, n / (Ub + 1), n % (Ub + 1), lane, ready, 0);
        },
        [](int) {});
    if (threadIdx.x == 0) tdt_tl_end(a.tl, TDT_TL_GRAD + 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory"); /* the stream's next work: after the sweeps */
#endif
#endif /* sm_90 code */
}

template <int DT, int G, int KD>
cudaError_t grad_launch_g(const tdt_gpu_args_t &a, int num_sms, cudaStream_t stream) {
    const int64_t per_block = kThreads / G;
    int64_t blocks = (a.nodes + per_block - 1) / per_block;
    const int64_t cap = (int64_t)num_sms * 32;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    const size_t smem = grad_stage_bytes<DT, GS_PLAIN>(kThreads);
    const cudaError_t e = tdt_allow_smem(grad_kernel<DT, G, KD>, smem);
    if (e != cudaSuccess) return e;
    grad_kernel<DT, G, KD><<<(unsigned)blocks, kThreads, smem, stream>>>(a);
    return cudaGetLastError();
}

/* The programmatic dependents: grad_ordered_kernel (SCHED GS_PLAIN: the split schedule's,
 * GS_FUSED: the fused one's) or grad_trail_kernel (GS_TRAIL), `blocks` blocks. */
template <int DT, int G, int KD, int SCHED>
cudaError_t grad_ordered_launch_g(const tdt_gpu_args_t &a, int blocks, cudaStream_t stream) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)blocks, 1, 1);
    const int threads = SCHED == GS_TRAIL ? (int)grad_trail<DT>::THREADS
                                          : (int)grad_ordered<DT, SCHED == GS_FUSED>::THREADS;
    cfg.blockDim = dim3((unsigned)threads, 1, 1);
    cfg.stream = stream;
    cudaLaunchAttribute attr = tdt_pdl_attr();
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    cfg.dynamicSmemBytes = grad_stage_bytes<DT, SCHED>(threads);
    void (*kernel)(const tdt_gpu_args_t);
    if constexpr (SCHED == GS_TRAIL) /* only this TU's kernels instantiated */
        kernel = grad_trail_kernel<DT, G, KD>;
    else
        kernel = grad_ordered_kernel<DT, G, KD, SCHED == GS_FUSED>;
    cudaError_t e = tdt_allow_smem(kernel, cfg.dynamicSmemBytes);
    if (e == cudaSuccess) e = cudaLaunchKernelEx(&cfg, kernel, a);
    return e != cudaSuccess ? e : cudaGetLastError();
}

template <int KD> struct grad_plain {
    const tdt_gpu_args_t &a;
    int num_sms;
    cudaStream_t stream;
    template <int DT, int G> cudaError_t go() const { return grad_launch_g<DT, G, KD>(a, num_sms, stream); }
};
template <int KD, int SCHED> struct grad_in_order {
    const tdt_gpu_args_t &a;
    int blocks;
    cudaStream_t stream;
    template <int DT, int G> cudaError_t go() const {
        return grad_ordered_launch_g<DT, G, KD, SCHED>(a, blocks, stream);
    }
};

/* The programmatic dependent of the split schedule (GS_PLAIN: grad.cu), of the fused one
 * (grad_fused.cu) or of the trail one (grad_trail.cu), each a translation unit of its own so
 * the sets of kernels compile in parallel, for the arc counts with their own instantiation. */
template <int SCHED> struct ordered_arcs {
    const tdt_gpu_args_t &a;
    tdt_dtype_t dtype;
    int blocks;
    cudaStream_t stream;
    template <int KD> cudaError_t go() const {
        return tdt_with_dtype(dtype, a.V, a.nodes, grad_in_order<KD, SCHED>{a, blocks, stream});
    }
};
template <int SCHED>
cudaError_t grad_ordered_launch(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks, cudaStream_t stream) {
    bool done;
    const cudaError_t e = tdt_with_arcs(a.arcs.count, ordered_arcs<SCHED>{a, dtype, blocks, stream}, &done);
    return done ? e : cudaErrorInvalidValue;
}

/* Enqueues the gradient kernel for arc count KD (0: any count), any dtype. */
template <int KD>
cudaError_t grad_launch(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms, cudaStream_t s) {
    return tdt_with_dtype(dtype, a.V, a.nodes, grad_plain<KD>{a, num_sms, s});
}

} /* namespace */

#endif /* TDT_GPU_GRAD_CUH */
