"""Memory under MXNet's arrays: its CPU temp space, and the C heap.

* :func:`share_cpu_temp_space` (at ``import mxamp``): MXNet keeps ``MXNET_CPU_TEMP_COPY``
  (default 4) temp-space buffers per CPU for operators' scratch memory (oneDNN's reorders
  among it) and hands them out in turn, so that operators on parallel worker threads do not
  wait for each other. Each buffer grows to the largest request it served, so a step can hold
  four buffers as large as its largest scratch, and which ones grow depends on the order of
  requests (the loss scaler's checks shift it). MXNet runs CPU operators on one worker thread
  (``MXNET_CPU_WORKER_NTHREADS``, default 1), where the other three buffers buy nothing.
  Where both are unset, mxamp asks MXNet for one. With it, a Transformer block trained in
  bfloat16 on a Zen 4 peaked at 773-783 MB instead of 896, and O2 at 732-755 instead of
  824-837, float32 without mxamp at 766-806. Steps ran as fast
  (``benchmark/results/native-amd-epyc-zen4/temp-space-ab-007c1c1.md``). float32 code in the
  same process gains the same way.
* :func:`release_free_memory`:

  MXNet's CPU storage allocates with the C allocator and frees at once, but glibc keeps most
  freed blocks in its heap for later use; after work whose buffers differ in size from what
  follows (``amp.tune``'s trials in the process), the process stays as large as its largest
  trial. glibc's ``malloc_trim`` returns the free pages; elsewhere (musl, macOS) this does
  nothing.
* :func:`trim_after_forward` (``amp.scale_loss`` on the CPU, with ``MXAMP_TRIM_HEAP=1``): the
  same, once per training step, between forward and backward. By then forward's temporaries
  are freed, but glibc keeps their pages, and backward's allocations, of other sizes, often
  land elsewhere, so a step's resident peak holds both. Measured on a Zen 4 (alternating
  processes, bfloat16): MLP training peaked at 655-675 MB instead of 703-716 with ``amp.init``
  (the reference: 701-703), O2 at 577-595 instead of 596-614 (float32: 593-604), ResNet-50 O2
  at 1443-1450 instead of 1453-1510 (float32: 2207-2265). The price: backward faults the
  returned pages back in, and MLP steps took 7-10% longer (fastest step 311-322 ms against
  289-292 with ``amp.init``). So it is off unless asked for.

>>> isinstance(release_free_memory(), bool)
True
"""
import ctypes
import ctypes.util
import gc
import logging
import os

from mxamp.backend import env

_LOG = logging.getLogger("mxamp")

#: How many CPU temp-space buffers mxamp asks MXNet for, where the user set neither variable.
CPU_TEMP_COPIES = 1
_SET_BY_MXAMP = []   # what share_cpu_temp_space set in this process (for the doctor)


def cpu_temp_space():
    """MXNet's CPU temp-space buffers in this process, in words, and who chose them.

    >>> 'MXNET_CPU_TEMP_COPY' in cpu_temp_space()
    True
    """
    chosen = env.value("MXNET_CPU_TEMP_COPY")
    if chosen is None:
        return "MXNET_CPU_TEMP_COPY unset: MXNet's default, 4 buffers"
    if _SET_BY_MXAMP and chosen == str(CPU_TEMP_COPIES):
        return "set by import mxamp: " + _SET_BY_MXAMP[-1]
    return "MXNET_CPU_TEMP_COPY=%s, yours" % chosen


def share_cpu_temp_space(environ=None):
    """Set ``MXNET_CPU_TEMP_COPY=1`` where neither it nor ``MXNET_CPU_WORKER_NTHREADS`` is set
    (see the module's docstring); returns what it did, in words ('' when it left MXNet alone).

    MXNet reads the variable once, when its resource manager starts at the first operator that
    needs it (a FullyConnected does, ``mx.nd.ones`` does not: measured with glibc's live-block
    count), so ``import mxamp`` sets it first of all, before its own AMX latch runs one. Set
    ``MXNET_CPU_TEMP_COPY`` yourself (4 is MXNet's default) to keep your own.

    >>> share_cpu_temp_space(environ={'MXNET_CPU_TEMP_COPY': '4'})
    ''
    >>> share_cpu_temp_space(environ={'MXNET_CPU_WORKER_NTHREADS': '4'})
    ''
    >>> e = {}; share_cpu_temp_space(environ=e); e
    'MXNET_CPU_TEMP_COPY=1 (one CPU temp-space buffer: MXNet runs CPU operators on one thread)'
    {'MXNET_CPU_TEMP_COPY': '1'}
    """
    environ = os.environ if environ is None else environ
    if env.value("MXNET_CPU_TEMP_COPY", environ) is not None or \
            env.value("MXNET_CPU_WORKER_NTHREADS", environ) is not None:
        return ""
    environ["MXNET_CPU_TEMP_COPY"] = str(CPU_TEMP_COPIES)
    said = ("MXNET_CPU_TEMP_COPY=%d (one CPU temp-space buffer: MXNet runs CPU operators on "
            "one thread)" % CPU_TEMP_COPIES)
    if environ is os.environ:
        _SET_BY_MXAMP.append(said)
    _LOG.debug("mxamp: set %s", said)
    return said

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


def trim_after_forward(losses, environ=None):
    """With ``MXAMP_TRIM_HEAP=1`` and ``losses`` on the CPU: wait for them (forward is then
    over) and give the C heap's free pages back (see the module's docstring); True where it
    trimmed. Off by default: backward then faults the pages back in, which cost 7-10% of an MLP
    step on a Zen 4. ``amp.scale_loss`` calls it every step; off, it costs one lookup.

    >>> trim_after_forward([], environ={})
    False
    >>> trim_after_forward([], environ={'MXAMP_TRIM_HEAP': '1'}) == (_malloc_trim() is not None)
    True
    """
    trim = _malloc_trim()
    if trim is None or not env.flag("MXAMP_TRIM_HEAP", environ):
        return False
    if any(loss.context.device_type != "cpu" for loss in losses):
        return False   # a GPU's memory is not the C heap's, and a wait would stall its queue
    for loss in losses:
        loss.wait_to_read()
    trim(0)   # 1 where pages went back, 0 where none were free: trimmed either way
    return True
