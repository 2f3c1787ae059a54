/*
 * old_program.c - a program built against release 0.6.0's header (tests/abi/tdt_0_6_0.h),
 * linked as 0.6.0 programs were (unversioned references to libwarptdt.so.0), run against the
 * current library. It computes NeMo's fixed TDT case through compute_tdt_loss() and through
 * tdt_forward() + tdt_backward() and checks the cost and the gradient at node (0, 0).
 *
 * Each struct it passes ends exactly where a page the program cannot read begins, so a library
 * that reads more of tdt_options_t (or tdt_problem_t, tdt_gradients_t) than 0.6.0 defined
 * crashes this program instead of reading whatever follows the struct.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tdt_0_6_0.h"

static int failures = 0;

#define CHECK_NEAR(what, got, want, tol)                                                       \
    do {                                                                                       \
        if (!(fabs((double)(got) - (double)(want)) <= (tol))) {                                \
            fprintf(stderr, "FAIL %s: got %.7f, want %.7f (tolerance %g)\n", what, (double)(got), \
                    (double)(want), (double)(tol));                                            \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

/* A zeroed object of `size` bytes that ends where an unreadable page begins. */
static void *guarded(size_t size) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p + page, page, PROT_NONE) != 0) return NULL;
    memset(p, 0, page);
    return p + page - size;
}

static int check_status(const char *call, tdt_status_t s) {
    if (s == TDT_STATUS_SUCCESS) return 1;
    fprintf(stderr, "FAIL %s: %s (%s)\n", call, tdt_status_string(s), tdt_last_error());
    failures++;
    return 0;
}

/* NeMo's fixed case: B 1, T 3, one label (0), V 4 with blank 3, durations {0, 1, 2},
 * sigma 0.05, every logit 0. Cost 4.155739; gradient at node (0, 0): tokens -0.649628, 0.25,
 * 0.25, 0.149628; durations 0.267258, -0.167926, -0.099332. */
enum { T = 3, U = 1, V = 4, D = 3 };
static const double want_token[V] = {-0.649628, 0.25, 0.25, 0.149628};
static const double want_duration[D] = {0.267258, -0.167926, -0.099332};

static void check_gradients(const char *how, float cost, const float *tg, const float *dg) {
    char what[96];
    snprintf(what, sizeof what, "%s cost", how);
    CHECK_NEAR(what, cost, 4.155739, 1e-5);
    for (int v = 0; v < V; v++) {
        snprintf(what, sizeof what, "%s token gradient (0, 0, %d)", how, v);
        CHECK_NEAR(what, tg[v], want_token[v], 1e-5);
    }
    for (int k = 0; k < D; k++) {
        snprintf(what, sizeof what, "%s duration gradient (0, 0, %d)", how, k);
        CHECK_NEAR(what, dg[k], want_duration[k], 1e-5);
    }
}

int main(void) {
    static float token_logits[T * (U + 1) * V], duration_logits[T * (U + 1) * D];
    static float token_grads[T * (U + 1) * V], duration_grads[T * (U + 1) * D];
    static unsigned char workspace[1 << 16];
    static const int durations[D] = {0, 1, 2};
    static const int32_t labels[U] = {0}, frame_lengths[1] = {T}, label_lengths[1] = {U};

    printf("header %d.%d.%d, library %s\n", TDT_VERSION_MAJOR, TDT_VERSION_MINOR,
           TDT_VERSION_PATCH, tdt_version_string());
    if (tdt_version() < TDT_VERSION_NUMBER) {
        fprintf(stderr, "FAIL: the library loaded is %d, not a release at or after the header's "
                        "(the stub was loaded: is the real library's directory first on "
                        "LD_LIBRARY_PATH?)\n", tdt_version());
        return 1;
    }

    tdt_options_t *o = guarded(sizeof *o);
    tdt_problem_t *p = guarded(sizeof *p);
    tdt_gradients_t *g = guarded(sizeof *g);
    if (!o || !p || !g) {
        fprintf(stderr, "FAIL: mmap\n");
        return 1;
    }
    o->location = TDT_LOCATION_CPU;
    o->num_threads = 1;
    o->blank = V - 1;
    o->durations = durations;
    o->num_durations = D;
    o->sigma = 0.05;
    p->batch = 1;
    p->max_frames = T;
    p->max_labels = U;
    p->vocab_size = V;
    p->dtype = TDT_DTYPE_FLOAT32;
    p->token_logits = token_logits;
    p->token_strides[0] = T * (U + 1) * V, p->token_strides[1] = (U + 1) * V, p->token_strides[2] = V;
    p->duration_logits = duration_logits;
    p->duration_strides[0] = T * (U + 1) * D, p->duration_strides[1] = (U + 1) * D,
    p->duration_strides[2] = D;
    p->labels = labels;
    p->frame_lengths = frame_lengths;
    p->label_lengths = label_lengths;
    g->token_grads = token_grads;
    memcpy(g->token_strides, p->token_strides, sizeof g->token_strides);
    g->duration_grads = duration_grads;
    memcpy(g->duration_strides, p->duration_strides, sizeof g->duration_strides);

    size_t ws = 0;
    if (!check_status("tdt_get_workspace_size", tdt_get_workspace_size(p, o, &ws))) return 1;
    if (ws > sizeof workspace) {
        fprintf(stderr, "FAIL: workspace of %zu bytes, more than this program's %zu\n", ws,
                sizeof workspace);
        return 1;
    }

    float cost = 0;
    if (check_status("compute_tdt_loss", compute_tdt_loss(p, o, &cost, g, workspace, ws)))
        check_gradients("compute_tdt_loss", cost, token_grads, duration_grads);

    memset(token_grads, 0, sizeof token_grads);
    memset(duration_grads, 0, sizeof duration_grads);
    const float upstream = 1.0f;
    cost = 0;
    if (check_status("tdt_forward", tdt_forward(p, o, &cost, workspace, ws)) &&
        check_status("tdt_backward", tdt_backward(p, o, &upstream, g, workspace, ws)))
        check_gradients("tdt_forward + tdt_backward", cost, token_grads, duration_grads);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("0.6.0 program against library %s: cost and gradient ok\n", tdt_version_string());
    return 0;
}
