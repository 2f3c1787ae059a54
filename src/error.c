/*
 * error.c - status strings and the per-thread error detail behind tdt_last_error().
 */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

/* One message per thread; a static buffer, so the library never allocates for it. */
static _Thread_local char tdt_error_detail[512];

void tdt_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tdt_error_detail, sizeof tdt_error_detail, fmt, ap);
    va_end(ap);
}

void tdt_clear_error(void) { tdt_error_detail[0] = '\0'; }

TDT_API const char *tdt_last_error(void) { return tdt_error_detail; }

TDT_API const char *tdt_status_string(tdt_status_t status) {
    switch (status) {
    case TDT_STATUS_SUCCESS: return "TDT_STATUS_SUCCESS: no error";
    case TDT_STATUS_NULL_POINTER: return "TDT_STATUS_NULL_POINTER: a required pointer is NULL";
    case TDT_STATUS_INVALID_SIZE:
        return "TDT_STATUS_INVALID_SIZE: a size is negative, zero where it must be positive, or "
               "too large";
    case TDT_STATUS_INVALID_BLANK: return "TDT_STATUS_INVALID_BLANK: blank is outside [0, vocab_size)";
    case TDT_STATUS_INVALID_DURATIONS:
        return "TDT_STATUS_INVALID_DURATIONS: a duration is negative or duplicated";
    case TDT_STATUS_NO_POSITIVE_DURATION:
        return "TDT_STATUS_NO_POSITIVE_DURATION: no duration is > 0, so no blank arc can advance";
    case TDT_STATUS_TOO_MANY_DURATIONS:
        return "TDT_STATUS_TOO_MANY_DURATIONS: num_durations is outside [1, TDT_MAX_DURATIONS]";
    case TDT_STATUS_INVALID_STRIDES:
        return "TDT_STATUS_INVALID_STRIDES: strides are negative, overflow, overlap, or differ "
               "from the logits' for an in-place gradient";
    case TDT_STATUS_INVALID_DTYPE: return "TDT_STATUS_INVALID_DTYPE: dtype is not a tdt_dtype_t";
    case TDT_STATUS_WORKSPACE_TOO_SMALL:
        return "TDT_STATUS_WORKSPACE_TOO_SMALL: workspace_bytes < tdt_get_workspace_size()";
    case TDT_STATUS_BACKEND_NOT_BUILT:
        return "TDT_STATUS_BACKEND_NOT_BUILT: this library was built without that backend";
    case TDT_STATUS_INVALID_LENGTH:
        return "TDT_STATUS_INVALID_LENGTH: a frame or label length is outside [0, max]";
    case TDT_STATUS_INVALID_LABEL:
        return "TDT_STATUS_INVALID_LABEL: a label is outside [0, vocab_size) or equals blank";
    case TDT_STATUS_INVALID_OPTION: return "TDT_STATUS_INVALID_OPTION: an option is out of range";
    case TDT_STATUS_INVALID_WORKSPACE:
        return "TDT_STATUS_INVALID_WORKSPACE: the workspace does not hold a forward pass of "
               "this problem";
    case TDT_STATUS_CUDA_ERROR: return "TDT_STATUS_CUDA_ERROR: a CUDA call or launch failed";
    case TDT_STATUS_UNKNOWN_ERROR: return "TDT_STATUS_UNKNOWN_ERROR: unknown error";
    }
    return "unrecognised tdt_status_t value";
}

TDT_API int tdt_version(void) { return TDT_VERSION_NUMBER; }

#define TDT_STR2(x) #x
#define TDT_STR(x) TDT_STR2(x)
TDT_API const char *tdt_version_string(void) {
    return TDT_STR(TDT_VERSION_MAJOR) "." TDT_STR(TDT_VERSION_MINOR) "." TDT_STR(TDT_VERSION_PATCH);
}
