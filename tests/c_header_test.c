/*
 * c_header_test.c - tdt.h is C: this file includes it and builds with
 * -std=c99 -Wall -Wextra -Werror -pedantic, touches every public type, and calls the API on the
 * hand-computable TDT lattice of test_golden.cc (T=2, U=1, V=2, durations {0,1}, zero logits:
 * cost log(32/3)). Exit status 0 on success.
 */
#include "tdt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);            \
            ++failures;                                                                         \
        }                                                                                       \
    } while (0)

int main(void) {
    tdt_options_t opt = {0};
    tdt_problem_t prob = {0};
    tdt_gradients_t grads = {0};
    tdt_status_t st;
    tdt_dtype_t dtype = TDT_DTYPE_FLOAT32;
    tdt_location_t loc = TDT_LOCATION_CPU;
    tdt_input_kind_t kind = TDT_INPUT_LOGITS;
    tdt_gpu_schedule_t schedule = TDT_GPU_SCHEDULE_AUTO;
    static const int durations[2] = {0, 1};
    float tok[2 * 2 * 2] = {0}, dur[2 * 2 * 2] = {0}, gtok[8], gdur[8], cost = 0.0f;
    const int32_t labels[1] = {1}, frames[1] = {2}, lens[1] = {1};
    size_t bytes = 0;
    void *ws;
    int count = 0;

    CHECK(tdt_version() == TDT_VERSION_NUMBER);
    CHECK(strlen(tdt_version_string()) >= 5);
    CHECK(tdt_status_string(TDT_STATUS_SUCCESS) != NULL);
    CHECK(tdt_backend_built(loc) == 1);
    st = tdt_gpu_device_count(&count);
    CHECK(st == TDT_STATUS_SUCCESS || st == TDT_STATUS_BACKEND_NOT_BUILT);

    opt.location = loc;
    opt.durations = durations;
    opt.num_durations = 2;
    opt.input_kind = kind;
    opt.gpu_schedule = schedule;
    prob.batch = 1;
    prob.max_frames = 2;
    prob.max_labels = 1;
    prob.vocab_size = 2;
    prob.dtype = dtype;
    prob.token_logits = tok;
    prob.token_strides[0] = 8;
    prob.token_strides[1] = 4;
    prob.token_strides[2] = 2;
    prob.duration_logits = dur;
    memcpy(prob.duration_strides, prob.token_strides, sizeof prob.duration_strides);
    prob.labels = labels;
    prob.frame_lengths = frames;
    prob.label_lengths = lens;
    grads.token_grads = gtok;
    memcpy(grads.token_strides, prob.token_strides, sizeof grads.token_strides);
    grads.duration_grads = gdur;
    memcpy(grads.duration_strides, prob.token_strides, sizeof grads.duration_strides);

    CHECK(tdt_check_data(&prob, &opt) == TDT_STATUS_SUCCESS);
    {
        /* int64 labels and lengths packed into the int32 layout, and judged */
        const int64_t labels64[1] = {1}, frames64[1] = {2}, lens64[1] = {1};
        int32_t packed[3] = {0, 0, 0}, valid = -1;
        tdt_indices_t idx = {0};
        tdt_index_type_t itype = TDT_INDEX_INT64;
        idx.type = itype;
        idx.labels = labels64;
        idx.columns = 1;
        idx.labels_stride = 1;
        idx.frame_lengths = frames64;
        idx.label_lengths = lens64;
        CHECK(tdt_pack_indices(&prob, &opt, &idx, packed, &valid) == TDT_STATUS_SUCCESS);
        CHECK(valid == 1 && packed[0] == 2 && packed[1] == 1 && packed[2] == 1);
    }
    st = tdt_get_workspace_size(&prob, &opt, &bytes);
    CHECK(st == TDT_STATUS_SUCCESS);
    ws = malloc(bytes);
    CHECK(ws != NULL);
    st = compute_tdt_loss(&prob, &opt, &cost, &grads, ws, bytes);
    if (st != TDT_STATUS_SUCCESS) fprintf(stderr, "%s: %s\n", tdt_status_string(st), tdt_last_error());
    CHECK(st == TDT_STATUS_SUCCESS);
    CHECK(fabs(cost - log(32.0 / 3.0)) < 1e-5);
    CHECK(fabs(gtok[0] - 1.0 / 3.0) < 1e-6 && fabs(gdur[7] + 0.5) < 1e-6);
    CHECK(strcmp(tdt_last_error(), "") == 0);

    /* the autograd binding's pair: tdt_forward_ahead (the CPU writes nothing ahead), then
     * tdt_backward; and tdt_scale_gradients by an exact factor */
    {
        int written = -1;
        float again = 0.0f, half = 0.5f;
        st = tdt_forward_ahead(&prob, &opt, &again, NULL, &grads, ws, bytes, &written);
        CHECK(st == TDT_STATUS_SUCCESS && written == 0 && again == cost);
        st = tdt_scale_gradients(&prob, &opt, &half, &grads);
        CHECK(st == TDT_STATUS_SUCCESS);
        CHECK(fabs(gtok[0] - 1.0 / 6.0) < 1e-6 && fabs(gdur[7] + 0.25) < 1e-6);
    }

    /* the fused joint + loss on the same lattice: W = 0 and no bias give zero logits, so the
     * same cost, and d enc = dz W = 0 exactly; d bias is the sum over the nodes of the logits'
     * gradient, whose token part sums to 0 at each node (softmax minus occupancies) */
    {
        tdt_joint_problem_t jp;
        tdt_joint_gradients_t jg;
        tdt_activation_t act = TDT_ACTIVATION_TANH;
        float enc[2 * 3] = {0.5f, -1.0f, 2.0f, 0.25f, 0.0f, -0.5f}, pred[2 * 3] = {1.0f, 1.0f, -1.0f, 0.0f, 3.0f, 0.5f};
        float w[4 * 3] = {0}, genc[2 * 3], gpred[2 * 3], gw[4 * 3], gbias[4], jcost = 0.0f;
        uint8_t keep[8];
        size_t jbytes = 0;
        void *jws;
        memset(&jp, 0, sizeof jp);
        memset(&jg, 0, sizeof jg);
        jp.batch = 1;
        jp.max_frames = 2;
        jp.max_labels = 1;
        jp.vocab_size = 2;
        jp.hidden = 3;
        jp.num_outputs = 4;
        jp.dtype = dtype;
        jp.enc = enc;
        jp.enc_strides[0] = 6;
        jp.enc_strides[1] = 3;
        jp.pred = pred;
        jp.pred_strides[0] = 6;
        jp.pred_strides[1] = 3;
        jp.weight = w;
        jp.weight_stride = 3;
        jp.bias = NULL;
        jp.activation = act;
        jp.dropout = 0.25;
        jp.dropout_seed = 7u;
        jp.dropout_offset = 0u;
        jp.labels = labels;
        jp.frame_lengths = frames;
        jp.label_lengths = lens;
        jg.enc_grad = genc;
        jg.enc_strides[0] = 6;
        jg.enc_strides[1] = 3;
        jg.pred_grad = gpred;
        jg.pred_strides[0] = 6;
        jg.pred_strides[1] = 3;
        jg.weight_grad = gw;
        jg.weight_stride = 3;
        jg.bias_grad = gbias;
        st = tdt_joint_get_workspace_size(&jp, &opt, &jbytes);
        CHECK(st == TDT_STATUS_SUCCESS);
        jws = malloc(jbytes);
        CHECK(jws != NULL);
        st = tdt_joint_loss(&jp, &opt, &jcost, &jg, jws, jbytes);
        CHECK(st == TDT_STATUS_SUCCESS);
        CHECK(fabs(jcost - log(32.0 / 3.0)) < 1e-5);
        CHECK(genc[0] == 0.0f && gpred[5] == 0.0f);
        CHECK(fabs(gbias[0] + gbias[1]) < 1e-6);
        st = tdt_joint_forward(&jp, &opt, &jcost, jws, jbytes);
        CHECK(st == TDT_STATUS_SUCCESS);
        st = tdt_joint_backward(&jp, &opt, NULL, &jg, jws, jbytes);
        CHECK(st == TDT_STATUS_SUCCESS);
        st = tdt_joint_dropout_mask(0.25, 7u, 0u, 8, keep);
        CHECK(st == TDT_STATUS_SUCCESS && keep[0] <= 1);
        jp.hidden = 0;
        st = tdt_joint_loss(&jp, &opt, &jcost, &jg, jws, jbytes);
        CHECK(st == TDT_STATUS_INVALID_SIZE);
        free(jws);
    }

    opt.blank = 2; /* outside [0, vocab_size) */
    st = compute_tdt_loss(&prob, &opt, &cost, &grads, ws, bytes);
    CHECK(st == TDT_STATUS_INVALID_BLANK);
    CHECK(strlen(tdt_last_error()) > 0);
    free(ws);

    if (failures) {
        fprintf(stderr, "c_header_test: %d check(s) failed\n", failures);
        return 1;
    }
    printf("c_header_test: ok (cost %.6f)\n", cost);
    return 0;
}
