"""warp_tdt: TDT (Token-and-Duration Transducer) and RNN-T losses for PyTorch, computed by the
warp-tdt C library (OpenMP on the CPU, CUDA on NVIDIA GPUs), loaded with ctypes.

    import warp_tdt
    loss = warp_tdt.tdt_loss(token_logits, duration_logits, targets, logit_lengths,
                             target_lengths, blank_token_id, durations, sigma=0.0,
                             reduction="mean")

``tdt_joint_loss`` fuses the joint's output layer with the loss (the logits are never held;
autograd reaches enc, pred, weight and bias); ``TDTJointLoss`` is its module, owning that layer.
``tdt_loss`` has the signature and semantics of ``transformers.loss.loss_tdt.tdt_loss``;
``rnnt_loss`` / ``RNNTLoss`` those of torchaudio's. The library is found through
``$WARP_TDT_LIBRARY``, next to this package, in the repository's CMake build tree
(``build/libwarptdt.so``), or on the system library path.
"""

from . import _lib
from ._lib import LibraryNotFoundError, WarpTDTError, WarpTDTValueError
from .functional import rnnt_loss, tdt_loss, tdt_loss_joint
from .joint import rnnt_joint_loss, tdt_joint_loss
from .modules import RNNTLoss, TDTJointLoss, TDTLoss

__version__ = "0.7.0"

__all__ = [
    "tdt_loss",
    "tdt_loss_joint",
    "rnnt_loss",
    "tdt_joint_loss",
    "rnnt_joint_loss",
    "TDTLoss",
    "TDTJointLoss",
    "RNNTLoss",
    "cuda_available",
    "empty_cache",
    "library_path",
    "library_version",
    "WarpTDTError",
    "WarpTDTValueError",
    "LibraryNotFoundError",
]


def empty_cache():
    """Releases the idle CPU buffers kept for reuse (the last gradient and workspace, see
    _hostmem.py); a buffer still in use is released when its last tensor is freed. Setting
    WARP_TDT_CPU_CACHE=0 turns the reuse off altogether."""
    from . import _hostmem

    _hostmem.empty_cache()


def library_path():
    """Path of the loaded libwarptdt (loads it; raises LibraryNotFoundError naming where it
    looked when there is none)."""
    return _lib.library_path()


def library_version():
    """Version string of the loaded library, e.g. "0.3.0"."""
    return _lib.version_string()


def cuda_available():
    """True when the loaded library was built with its CUDA backend and torch sees a GPU."""
    import torch

    return _lib.backend_built(_lib.LOCATION_GPU) and torch.cuda.is_available()
