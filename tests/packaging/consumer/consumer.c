/* consumer.c - uses an installed warp-tdt: NeMo's fixed TDT case (B 1, T 3, one label 0, V 4
 * with blank 3, durations {0, 1, 2}, sigma 0.05, every logit 0) has cost 4.155739. */
#include <math.h>
#include <stdio.h>

#include <tdt.h>

int main(void) {
    static float token_logits[3 * 2 * 4], duration_logits[3 * 2 * 3];
    static unsigned char workspace[1 << 16];
    static const int durations[3] = {0, 1, 2};
    static const int32_t labels[1] = {0}, frame_lengths[1] = {3}, label_lengths[1] = {1};
    tdt_options_t o = {0};
    o.blank = 3;
    o.durations = durations;
    o.num_durations = 3;
    o.sigma = 0.05;
    tdt_problem_t p = {0};
    p.batch = 1, p.max_frames = 3, p.max_labels = 1, p.vocab_size = 4;
    p.dtype = TDT_DTYPE_FLOAT32;
    p.token_logits = token_logits;
    p.token_strides[0] = 24, p.token_strides[1] = 8, p.token_strides[2] = 4;
    p.duration_logits = duration_logits;
    p.duration_strides[0] = 18, p.duration_strides[1] = 6, p.duration_strides[2] = 3;
    p.labels = labels, p.frame_lengths = frame_lengths, p.label_lengths = label_lengths;
    size_t ws = 0;
    float cost = 0;
    tdt_status_t s = tdt_get_workspace_size(&p, &o, &ws);
    if (s == TDT_STATUS_SUCCESS && ws > sizeof workspace) s = TDT_STATUS_WORKSPACE_TOO_SMALL;
    if (s == TDT_STATUS_SUCCESS) s = compute_tdt_loss(&p, &o, &cost, NULL, workspace, ws);
    if (s != TDT_STATUS_SUCCESS) {
        fprintf(stderr, "FAIL: %s (%s)\n", tdt_status_string(s), tdt_last_error());
        return 1;
    }
    if (tdt_version() != TDT_VERSION_NUMBER) {
        fprintf(stderr, "FAIL: header %d, library %d\n", TDT_VERSION_NUMBER, tdt_version());
        return 1;
    }
    if (fabs(cost - 4.155739) > 1e-5) {
        fprintf(stderr, "FAIL: cost %.7f, want 4.155739\n", cost);
        return 1;
    }
    printf("warp-tdt %s: cost %.6f\n", tdt_version_string(), cost);
    return 0;
}
