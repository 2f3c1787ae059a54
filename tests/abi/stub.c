/*
 * stub.c - a stand-in for libwarptdt.so.0 as release 0.6.0 shipped it: the functions of that
 * release's header, with no symbol versions. A program linked against it records unversioned
 * references to libwarptdt.so.0, exactly as a program built against 0.6.0 did; the test then
 * runs it with the real, current library found first. Never run itself: every call fails.
 */
#include "tdt_0_6_0.h"

TDT_API tdt_status_t tdt_get_workspace_size(const tdt_problem_t *p, const tdt_options_t *o,
                                            size_t *n) {
    (void)p, (void)o, (void)n;
    return TDT_STATUS_UNKNOWN_ERROR;
}
TDT_API tdt_status_t compute_tdt_loss(const tdt_problem_t *p, const tdt_options_t *o, void *c,
                                      const tdt_gradients_t *g, void *w, size_t n) {
    (void)p, (void)o, (void)c, (void)g, (void)w, (void)n;
    return TDT_STATUS_UNKNOWN_ERROR;
}
TDT_API tdt_status_t tdt_forward(const tdt_problem_t *p, const tdt_options_t *o, void *c, void *w,
                                 size_t n) {
    (void)p, (void)o, (void)c, (void)w, (void)n;
    return TDT_STATUS_UNKNOWN_ERROR;
}
TDT_API tdt_status_t tdt_backward(const tdt_problem_t *p, const tdt_options_t *o, const void *gc,
                                  const tdt_gradients_t *g, void *w, size_t n) {
    (void)p, (void)o, (void)gc, (void)g, (void)w, (void)n;
    return TDT_STATUS_UNKNOWN_ERROR;
}
TDT_API const char *tdt_status_string(tdt_status_t s) {
    (void)s;
    return "stub";
}
TDT_API const char *tdt_last_error(void) { return "stub"; }
TDT_API int tdt_version(void) { return -1; }
TDT_API const char *tdt_version_string(void) { return "stub"; }
