"""Host memory for the big CPU buffers (the logits' gradient, a large workspace): reused from call
to call instead of freshly mapped each time.

Why: glibc serves any allocation over 32 MiB with a fresh mmap and unmaps it on free, so every
gradient torch.empty_like() hands out is new memory. The kernel then faults each 4 KiB page in and
zero-fills it when the library first writes it: for the `base` shape's 69 MB gradient on the
2-core test VM that is ~28 ms per call with 1 thread and ~18 ms with 2, as much as the loss
itself (28 / 15 ms through the C API). The library
writes every gradient element, so the buffer needs no zeroing of its own, and memory that the
previous step's gradient used (and autograd has since dropped) is as good as new.

How: one anonymous private mapping per slot ("grad", "workspace"), advised for transparent huge
pages where the kernel offers them (fewer, cheaper faults the first time). Each handout is a tensor
made by torch.frombuffer over a fresh memoryview of the mapping: the tensor's storage holds that
memoryview until the storage dies, and the slot keeps only a weak reference to it, so the
mapping is free again exactly when that weak reference is dead (no reference counting by hand).
Then the next call of the same slot gets it again, when the size fits. While any tensor still
uses it the next call maps a new one, and the old one is unmapped when its last tensor dies.
Retained memory: at most one idle buffer per slot, the size of the last one used
(warp_tdt.empty_cache() drops it; WARP_TDT_CPU_CACHE=0 turns the reuse off).

Only used on the CPU for buffers of at least MIN_BYTES with a plain contiguous layout; everything
else goes through torch's allocator as before.
"""

import mmap
import threading
import weakref

import torch

from . import _lib

__all__ = ["empty", "empty_cache", "enabled"]

MIN_BYTES = 1 << 20  # below this glibc's heap already recycles memory
_HUGE = 1 << 21  # capacity granule: one transparent huge page

_lock = threading.Lock()
_slots = {}  # slot name -> (mmap.mmap, weak reference to the memoryview of its last handout)


def _probe():
    if not (hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
            and hasattr(torch, "frombuffer")):
        return False
    try:
        weakref.ref(memoryview(b""))
    except TypeError:
        return False
    return True


_supported = _probe()
_CACHE_ENV = _lib.EnvVar("WARP_TDT_CPU_CACHE")
_itemsize = {}  # dtype -> bytes an element


def enabled():
    return _supported and _CACHE_ENV.get("1") != "0"


def _map(nbytes):
    cap = (nbytes + _HUGE - 1) // _HUGE * _HUGE
    buf = mmap.mmap(-1, cap, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages
            pass
    return buf


def empty(shape, dtype, slot):
    """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``, or None when the cache
    does not apply (then the caller allocates through torch)."""
    numel = 1
    for n in shape:
        numel *= int(n)
    size = _itemsize.get(dtype)
    if size is None:  # asked of torch once a dtype (an empty tensor's allocation, each call before)
        size = _itemsize[dtype] = torch.empty(0, dtype=dtype).element_size()
    nbytes = numel * size
    if nbytes < MIN_BYTES or not enabled():
        return None
    with _lock:
        buf, last = _slots.get(slot, (None, None))
        if buf is None or last() is not None or not nbytes <= len(buf) <= 4 * nbytes + _HUGE:
            buf = _map(nbytes)  # none yet, still in use, or the wrong size
        view = memoryview(buf)
        _slots[slot] = (buf, weakref.ref(view))
        return torch.frombuffer(view, dtype=dtype, count=numel).view(shape)


def empty_cache():
    """Drops the idle buffers (a buffer still in use is unmapped when its last tensor dies)."""
    with _lock:
        _slots.clear()
