"""The C heap under MXNet: hand memory that MXNet freed back to the operating system.

MXNet's CPU storage allocates with the C allocator and frees at once, but glibc keeps most
freed blocks in its heap for later use; after work whose buffers differ in size from what
follows (``amp.tune``'s trials), the process stays as large as its largest trial. glibc's
``malloc_trim`` returns the free pages; elsewhere (musl, macOS) this does nothing.

>>> isinstance(release_free_memory(), bool)
True
"""
import ctypes
import ctypes.util
import gc

_TRIM = []


def _malloc_trim():
    if not _TRIM:
        try:
            _TRIM.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    return _TRIM[0]


def release_free_memory():
    """Collect Python's garbage, then give the C heap's free pages back; True if trimmed."""
    gc.collect()
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
