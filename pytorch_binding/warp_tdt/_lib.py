"""Finding and loading the warp-tdt shared library, and its C types (include/tdt.h) in ctypes.

Nothing here knows about PyTorch: this module mirrors the C header and turns a failed status into
a Python exception. The library is loaded lazily, on the first call that needs it, so that
``import warp_tdt`` works (and says where it looked) even before the library is built.

Search order (the first that exists wins):

1. ``$WARP_TDT_LIBRARY``: a path to the shared library. When set, nothing else is tried.
2. Next to this package: ``warp_tdt/libwarptdt.so``, the library ``pip install`` builds (or
   takes from WARP_TDT_LIBRARY) and ships inside the package (setup.py).
3. The CMake build tree of the repository this package sits in: ``<repo>/build/libwarptdt.so``
   (a source checkout used without installing, PYTHONPATH=pytorch_binding).
4. The system's library path (``ctypes.util.find_library("warptdt")``, after ``cmake --install``).
"""

import ctypes
import ctypes.util
import os
import sys
import threading

__all__ = [
    "EnvVar",
    "WarpTDTError",
    "WarpTDTValueError",
    "LibraryNotFoundError",
    "load",
    "library_path",
    "candidate_paths",
]

# ---- C enums (pinned numbers, see include/tdt.h) ----------------------------------------------
STATUS_SUCCESS = 0
STATUS_NAMES = {
    0: "TDT_STATUS_SUCCESS",
    1: "TDT_STATUS_NULL_POINTER",
    2: "TDT_STATUS_INVALID_SIZE",
    3: "TDT_STATUS_INVALID_BLANK",
    4: "TDT_STATUS_INVALID_DURATIONS",
    5: "TDT_STATUS_NO_POSITIVE_DURATION",
    6: "TDT_STATUS_TOO_MANY_DURATIONS",
    7: "TDT_STATUS_INVALID_STRIDES",
    8: "TDT_STATUS_INVALID_DTYPE",
    9: "TDT_STATUS_WORKSPACE_TOO_SMALL",
    10: "TDT_STATUS_BACKEND_NOT_BUILT",
    11: "TDT_STATUS_INVALID_LENGTH",
    12: "TDT_STATUS_INVALID_LABEL",
    13: "TDT_STATUS_INVALID_OPTION",
    14: "TDT_STATUS_INVALID_WORKSPACE",
    15: "TDT_STATUS_CUDA_ERROR",
    99: "TDT_STATUS_UNKNOWN_ERROR",
}
# Statuses that describe a bad argument value: raised as WarpTDTValueError (a ValueError too).
_VALUE_STATUSES = {2, 3, 4, 5, 6, 7, 8, 11, 12, 13}

LOCATION_CPU = 0
LOCATION_GPU = 1

DTYPE_FLOAT32 = 0
DTYPE_FLOAT64 = 1
DTYPE_FLOAT16 = 2
DTYPE_BFLOAT16 = 3

INPUT_LOGITS = 0
INPUT_LOG_PROBS = 1

GPU_SCHEDULE_AUTO = 0  # tdt_gpu_schedule_t
GPU_SCHEDULE_SERIAL = 1
GPU_SCHEDULE_OVERLAP = 2
GPU_SCHEDULE_SPLIT = 3
GPU_SCHEDULE_FUSED = 4
GPU_SCHEDULE_TRAIL = 5

REDUCTION_NONE = 0  # tdt_reduction_t
REDUCTION_SUM = 1
REDUCTION_MEAN = 2

MAX_DURATIONS = 32  # TDT_MAX_DURATIONS

INDEX_INT32 = 0  # tdt_index_type_t
INDEX_INT64 = 1

ACTIVATION_RELU = 0  # tdt_activation_t
ACTIVATION_TANH = 1
ACTIVATION_SIGMOID = 2
ACTIVATION_IDENTITY = 3

c_int64_3 = ctypes.c_int64 * 3
c_int64_2 = ctypes.c_int64 * 2


class Options(ctypes.Structure):
    """tdt_options_t. Zero means default for every field."""

    _fields_ = [
        ("location", ctypes.c_int),
        ("num_threads", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("blank", ctypes.c_int),
        ("durations", ctypes.POINTER(ctypes.c_int)),
        ("num_durations", ctypes.c_int),
        ("sigma", ctypes.c_double),
        ("fastemit_lambda", ctypes.c_double),
        ("clamp", ctypes.c_double),
        ("input_kind", ctypes.c_int),
        ("grad_costs_scalar", ctypes.c_int),
        ("gpu_schedule", ctypes.c_int),
        ("normalize_costs", ctypes.c_int),
        ("batch_mean", ctypes.c_int),
        ("reduction", ctypes.c_int),
        ("reduced_cost", ctypes.c_void_p),
        ("pack", ctypes.c_void_p),  # const tdt_indices_t * (0.5.0)
        ("pack_valid", ctypes.c_void_p),
        ("state_in_grads", ctypes.c_int),  # (0.6.0)
        # the library reads its whole tdt_options_t, which grows at its end from version to
        # version with every new field's zero its default: a newer library than this package
        # then reads zeros here, its new fields' defaults, not whatever follows the struct
        ("_newer_fields_zero", ctypes.c_char * 260),  # 256, and up to the struct's 8-byte end
    ]


class Problem(ctypes.Structure):
    """tdt_problem_t: shapes, logits (with element strides of dims b, t, u), labels, lengths."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("max_frames", ctypes.c_int64),
        ("max_labels", ctypes.c_int64),
        ("vocab_size", ctypes.c_int64),
        ("dtype", ctypes.c_int),
        ("token_logits", ctypes.c_void_p),
        ("token_strides", c_int64_3),
        ("duration_logits", ctypes.c_void_p),
        ("duration_strides", c_int64_3),
        ("labels", ctypes.c_void_p),
        ("frame_lengths", ctypes.c_void_p),
        ("label_lengths", ctypes.c_void_p),
    ]


class Gradients(ctypes.Structure):
    """tdt_gradients_t: where the two gradients go (NULL skips one)."""

    _fields_ = [
        ("token_grads", ctypes.c_void_p),
        ("token_strides", c_int64_3),
        ("duration_grads", ctypes.c_void_p),
        ("duration_strides", c_int64_3),
    ]


class Indices(ctypes.Structure):
    """tdt_indices_t: labels and lengths in the caller's integer type, for tdt_pack_indices()."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("labels", ctypes.c_void_p),
        ("columns", ctypes.c_int64),
        ("labels_stride", ctypes.c_int64),
        ("frame_lengths", ctypes.c_void_p),
        ("label_lengths", ctypes.c_void_p),
    ]


class JointProblem(ctypes.Structure):
    """tdt_joint_problem_t: the fused joint's inputs (enc, pred, the output layer's weight and
    bias, element strides), its activation and dropout, labels and lengths."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("max_frames", ctypes.c_int64),
        ("max_labels", ctypes.c_int64),
        ("vocab_size", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("num_outputs", ctypes.c_int64),
        ("dtype", ctypes.c_int),
        ("enc", ctypes.c_void_p),
        ("enc_strides", c_int64_2),
        ("pred", ctypes.c_void_p),
        ("pred_strides", c_int64_2),
        ("weight", ctypes.c_void_p),
        ("weight_stride", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
        ("activation", ctypes.c_int),
        ("dropout", ctypes.c_double),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("labels", ctypes.c_void_p),
        ("frame_lengths", ctypes.c_void_p),
        ("label_lengths", ctypes.c_void_p),
    ]


class JointGradients(ctypes.Structure):
    """tdt_joint_gradients_t: where the gradients of enc, pred, weight and bias go (NULL skips
    one), and skip_below (0: exact)."""

    _fields_ = [
        ("enc_grad", ctypes.c_void_p),
        ("enc_strides", c_int64_2),
        ("pred_grad", ctypes.c_void_p),
        ("pred_strides", c_int64_2),
        ("weight_grad", ctypes.c_void_p),
        ("weight_stride", ctypes.c_int64),
        ("bias_grad", ctypes.c_void_p),
        ("skip_below", ctypes.c_double),
    ]


# ---- errors -------------------------------------------------------------------------------------


class WarpTDTError(RuntimeError):
    """A warp-tdt C call failed. ``status`` is the tdt_status_t number, ``status_name`` its
    name, ``detail`` the library's tdt_last_error() text (which argument, which value)."""

    def __init__(self, function, status, status_string, detail):
        self.function = function
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "TDT_STATUS_%d" % self.status)
        self.status_string = status_string
        self.detail = detail
        msg = "warp_tdt: %s failed: %s" % (function, status_string)
        if detail:
            msg += " (%s)" % detail
        super().__init__(msg)


class WarpTDTValueError(WarpTDTError, ValueError):
    """A warp-tdt C call refused an argument value (both a RuntimeError and a ValueError)."""


class LibraryNotFoundError(OSError):
    """The shared library was not found; the message lists every place that was tried."""


# ---- finding the library -----------------------------------------------------------------------

_LIB_NAMES = {
    "darwin": ("libwarptdt.dylib",),
    "win32": ("warptdt.dll", "libwarptdt.dll"),
}.get(sys.platform, ("libwarptdt.so", "libwarptdt.so.0"))

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# pytorch_binding/warp_tdt -> the repository root (only meaningful in a source checkout).
_REPO_ROOT = os.path.dirname(os.path.dirname(_PKG_DIR))


def candidate_paths():
    """The (place, path) pairs tried, in order, when WARP_TDT_LIBRARY is not set."""
    out = []
    for name in _LIB_NAMES:
        out.append(("next to the package", os.path.join(_PKG_DIR, name)))
    for name in _LIB_NAMES:
        out.append(("CMake build tree", os.path.join(_REPO_ROOT, "build", name)))
    return out


_lock = threading.Lock()
_lib = None
_lib_path = None


def _declare(lib):
    c_void_p, c_size_t, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    P = ctypes.POINTER
    lib.tdt_get_workspace_size.argtypes = [P(Problem), P(Options), P(c_size_t)]
    lib.tdt_get_workspace_size.restype = c_int
    lib.compute_tdt_loss.argtypes = [P(Problem), P(Options), c_void_p, P(Gradients), c_void_p, c_size_t]
    lib.compute_tdt_loss.restype = c_int
    lib.tdt_forward.argtypes = [P(Problem), P(Options), c_void_p, c_void_p, c_size_t]
    lib.tdt_forward.restype = c_int
    lib.tdt_backward.argtypes = [P(Problem), P(Options), c_void_p, P(Gradients), c_void_p, c_size_t]
    lib.tdt_backward.restype = c_int
    lib.tdt_status_string.argtypes = [c_int]
    lib.tdt_status_string.restype = ctypes.c_char_p
    lib.tdt_last_error.argtypes = []
    lib.tdt_last_error.restype = ctypes.c_char_p
    lib.tdt_version.argtypes = []
    lib.tdt_version.restype = c_int
    lib.tdt_version_string.argtypes = []
    lib.tdt_version_string.restype = ctypes.c_char_p
    lib.tdt_backend_built.argtypes = [c_int]
    lib.tdt_backend_built.restype = c_int
    lib.tdt_gpu_device_count.argtypes = [P(c_int)]
    lib.tdt_gpu_device_count.restype = c_int
    if hasattr(lib, "tdt_check_data"):  # a library older than the binding checks in numpy
        lib.tdt_check_data.argtypes = [P(Problem), P(Options)]
        lib.tdt_check_data.restype = c_int
    if hasattr(lib, "tdt_forward_ahead"):  # an older library: the forward never writes them
        lib.tdt_forward_ahead.argtypes = [P(Problem), P(Options), c_void_p, c_void_p, P(Gradients),
                                          c_void_p, c_size_t, P(c_int)]
        lib.tdt_forward_ahead.restype = c_int
        lib.tdt_scale_gradients.argtypes = [P(Problem), P(Options), c_void_p, P(Gradients)]
        lib.tdt_scale_gradients.restype = c_int
    if hasattr(lib, "tdt_pack_indices"):  # an older library: torch packs them
        lib.tdt_pack_indices.argtypes = [P(Problem), P(Options), P(Indices), c_void_p, c_void_p]
        lib.tdt_pack_indices.restype = c_int
    if hasattr(lib, "tdt_joint_forward"):  # an older library: no fused joint (joint.py says so)
        JP, JG = P(JointProblem), P(JointGradients)
        lib.tdt_joint_get_workspace_size.argtypes = [JP, P(Options), P(c_size_t)]
        lib.tdt_joint_get_workspace_size.restype = c_int
        lib.tdt_joint_loss.argtypes = [JP, P(Options), c_void_p, JG, c_void_p, c_size_t]
        lib.tdt_joint_loss.restype = c_int
        lib.tdt_joint_forward.argtypes = [JP, P(Options), c_void_p, c_void_p, c_size_t]
        lib.tdt_joint_forward.restype = c_int
        lib.tdt_joint_backward.argtypes = [JP, P(Options), c_void_p, JG, c_void_p, c_size_t]
        lib.tdt_joint_backward.restype = c_int
        lib.tdt_joint_dropout_mask.argtypes = [ctypes.c_double, ctypes.c_uint64, ctypes.c_uint64,
                                               ctypes.c_int64, c_void_p]
        lib.tdt_joint_dropout_mask.restype = c_int


def _open(path):
    lib = ctypes.CDLL(path)
    try:
        _declare(lib)
    except AttributeError as e:
        raise OSError("%s is not a warp-tdt library (missing symbol: %s)" % (path, e)) from e
    return lib


def load():
    """The loaded library (a ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("WARP_TDT_LIBRARY")
        if env:
            if not os.path.isfile(env):
                raise LibraryNotFoundError(
                    "warp_tdt: WARP_TDT_LIBRARY=%s does not name a file. Point it at a built "
                    "libwarptdt.so, or unset it to search next to the package and in the CMake "
                    "build tree." % env)
            lib, path = _open(env), env
        else:
            lib = path = None
            errors = []
            for place, cand in candidate_paths():
                tried.append("%s: %s" % (place, cand))
                if os.path.isfile(cand):
                    try:
                        lib, path = _open(cand), cand
                        break
                    except OSError as e:  # e.g. a library built for another machine
                        errors.append("%s: %s" % (cand, e))
            if lib is None:
                found = ctypes.util.find_library("warptdt")
                tried.append("system library path: ctypes.util.find_library('warptdt') -> %s" % found)
                if found:
                    try:
                        lib, path = _open(found), found
                    except OSError as e:
                        errors.append("%s: %s" % (found, e))
            if lib is None:
                msg = ("warp_tdt: could not find the warp-tdt shared library. Looked in:\n  "
                       + "\n  ".join(tried) + "\nand WARP_TDT_LIBRARY is not set. " + _advice())
                if errors:
                    msg += "\nFound but could not load:\n  " + "\n  ".join(errors)
                raise LibraryNotFoundError(msg)
        _lib, _lib_path = lib, path
        return _lib


def _advice():
    """What to do about a missing library, for an installed package or a source checkout."""
    if os.path.isfile(os.path.join(_REPO_ROOT, "CMakeLists.txt")):  # a source checkout
        return ("Build it in the repository root (%s) with `cmake -B build && cmake --build "
                "build -j --target warptdt`, or install the package with `pip install "
                "--no-build-isolation ./pytorch_binding` there (which builds the library into "
                "it), or set WARP_TDT_LIBRARY=/path/to/libwarptdt.so." % _REPO_ROOT)
    return ("This installed package has no library inside (it was installed with "
            "WARP_TDT_NO_LIBRARY set, or its library was removed). Reinstall it from a checkout "
            "of warp-tdt with `pip install --no-build-isolation --force-reinstall "
            "./pytorch_binding`, which builds the library with CMake and ships it, or set "
            "WARP_TDT_LIBRARY=/path/to/libwarptdt.so.")


def library_path():
    """Path of the loaded shared library (loads it if needed)."""
    load()
    return _lib_path


def _reset_for_tests():
    """Forget the loaded library so the next call searches again (tests only)."""
    global _lib, _lib_path
    with _lock:
        _lib = None
        _lib_path = None


# ---- environment ---------------------------------------------------------------------------------


class EnvVar:
    """An environment variable the binding reads on every call: ``get()`` is
    ``os.environ.get(name, default)``, read from os.environ's own mapping of encoded names where
    CPython keeps one (every change through os.environ lands there too). A dict lookup, ~30 ns,
    where os.environ.get of an unset name takes ~0.5 us here and more on a GPU host's cold
    step; an eager step reads four (docs/performance.md, "The binding's host time"). A replaced os.environ, or a
    Python without that mapping, is read through os.environ.get."""

    __slots__ = ("name", "_key")

    def __init__(self, name):
        self.name = name
        try:
            self._key = os.environ.encodekey(name)
        except (AttributeError, TypeError):
            self._key = None

    def get(self, default=None):
        env = os.environ
        if env is _environ and _environ_data is not None and self._key is not None:
            value = _environ_data.get(self._key)
            return default if value is None else _environ.decodevalue(value)
        return env.get(self.name, default)


_environ = os.environ
_environ_data = getattr(_environ, "_data", None)
if not isinstance(_environ_data, dict) or not hasattr(_environ, "decodevalue"):
    _environ_data = None


# ---- small wrappers -----------------------------------------------------------------------------


def status_string(status):
    s = load().tdt_status_string(int(status))
    return s.decode("utf-8", "replace") if s else ""


def last_error():
    s = load().tdt_last_error()
    return s.decode("utf-8", "replace") if s else ""


def check(function, status):
    """Raises WarpTDTError (or WarpTDTValueError) unless status is TDT_STATUS_SUCCESS."""
    if status == STATUS_SUCCESS:
        return
    # tdt_last_error() is thread-local and ctypes calls from this same thread, so it belongs to
    # the call that just failed.
    detail = last_error()
    cls = WarpTDTValueError if status in _VALUE_STATUSES else WarpTDTError
    raise cls(function, status, status_string(status), detail)


def version():
    """The loaded library's version number, MAJOR * 10000 + MINOR * 100 + PATCH."""
    return int(load().tdt_version())


def version_string():
    return load().tdt_version_string().decode()


def backend_built(location):
    return bool(load().tdt_backend_built(int(location)))


def gpu_device_count():
    """CUDA devices the library sees; 0 in a build without CUDA."""
    lib = load()
    if not lib.tdt_backend_built(LOCATION_GPU):
        return 0
    n = ctypes.c_int(0)
    check("tdt_gpu_device_count", lib.tdt_gpu_device_count(ctypes.byref(n)))
    return int(n.value)
