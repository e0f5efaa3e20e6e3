"""Memory around MXNet's arrays: its CPU temp space, oneDNN's scratch and the C heap. How
MXNet's graphs share and free storage is :mod:`mxamp.backend.graph_memory`'s.

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
* :func:`bound_primitive_cache` (at ``import mxamp``): MXNet caches every oneDNN primitive it
  creates, per operator type and shape, for the life of the process, and its build has oneDNN
  give each primitive its own scratch memory, allocated with the primitive. A bfloat16
  convolution's backward-weights primitive accumulates in float32 there, so a bfloat16 model
  keeps about a float32 copy of each convolution's weight gradient between steps, beside the
  bfloat16 gradient itself. An allocation trace at ResNet-50 O2's peak (batch 16, Zen 4)
  found 116 MB of such scratch alive (83 MB in backward, 28 in forward primitives), against
  22 MB in float32 (``benchmark/results/native-amd-epyc-zen4/onednn-scratch-8869271.md``).
  With ``MXNET_MKLDNN_CACHE_NUM=0`` MXNet keeps one primitive per operator type, and the
  scratch lives while its operator runs: the live peak went from 1280 to 1164 MB and the
  resident peak from 1444-1574 to 1381-1405 MB in 3 of 4 runs, steps as fast. Where the CPU
  has AVX512-BF16 and no AMX is asked for (class ``native``), mxamp sets it where you did
  not.
* :func:`share_one_c_heap` (at ``import mxamp``): glibc gives each thread that allocates its
  own malloc arena (up to 8 per core), and MXNet allocates from its engine thread, oneDNN's
  OpenMP threads and Python's. A block freed in one arena cannot serve a request made from
  another, and which thread asks first varies from run to run. On ResNet-50 O2 (batch 16,
  Zen 4, ``heap-phases.py``) the live bytes peaked at 1164-1171 MB in every process, but
  the resident peak landed at 1365-1389 MB in 8 processes of 12 and at 1441, 1445, 1513 and
  1747 MB in the other 4, the jump at a different step each time; with one arena, 12 of 12
  landed at 1365-1382 MB (``benchmark/results/native-amd-epyc-zen4/c-heap-arenas-df21800.md``).
* :func:`keep_freed_pages` (at ``import mxamp``): glibc gives the free top of its heap back
  to the kernel as soon as it passes a threshold it adapts, and maps large blocks on their own;
  each page given back is faulted in again, zeroed, at the next step. With one arena, every
  thread frees into the heap whose top it trims, and steps faulted twice as often: float32
  MobileNet training after ``import mxamp`` took 850-874 thousand minor faults a process
  against 369-371 thousand without mxamp, and ran 25-35% slower. mxamp fixes the trim
  threshold at 256 MB, so that the heap's freed pages go back when mxamp trims, and the mmap
  threshold at 16 MB: larger blocks are mapped on their own and go back when freed. That
  threshold trades speed for memory (ResNet-50 under ``amp.init``, peak MB and ms a step: 4
  MB 1309-1318 and 1489-1687, 16 MB 1398-1407 and 1301-1377, 32 MB 1446-1496 and
  1276-1413; float32 MobileNet after import ran as fast at 16 MB as without mxamp).
  Results, per process: ``benchmark/results/native-amd-epyc-zen4/c-heap-trim/``.
* :func:`release_free_memory`:

  MXNet's CPU storage allocates with the C allocator and frees at once, but glibc keeps most
  freed blocks in its heap for later use; after work whose buffers differ in size from what
  follows (``amp.tune``'s trials in the process), the process stays as large as its largest
  trial. glibc's ``malloc_trim`` returns the free pages; elsewhere (musl, macOS) this does
  nothing.
* :func:`release_before_first_call` (a converted model's first call): the same, where
  ``MXAMP_TRIM_HEAP`` is not ``0``. ``net = amp.convert_hybrid_block(net)`` drops the source
  model, whose float32 parameters and gradients go back to glibc's heap, and the converted
  model's first call plans all its buffers at once (``static_alloc``), in sizes those blocks
  do not fit: the process then holds both. 24 Dense(1024) layers: resident memory after the
  first call was 264 MB above the start, 60 with the release (the converted parameters are
  48). Converted ResNet-50 inference (batch 8, ``benchmark/run_all.py``, two processes a
  cell, Zen 4): the peak 575-578 MB in bfloat16, against 588-590 before; under
  ``DNNL_MAX_CPU_ISA=AVX2`` (float32 compute) 602 against 683-685, where float32 after
  ``import mxamp`` peaks at 621 (``benchmark/results/native-amd-epyc-zen4/
  converted-first-call/``). In a script, what stays resident after six calls: 381-392 MB
  against 589-598.
* :func:`trim_after_forward` (``amp.scale_loss`` on the CPU): the same, between forward and
  backward, on the steps where the process's resident peak grew by more than
  :data:`PEAK_GROWTH` since the last trim (``MXAMP_TRIM_HEAP`` unset), on every step (``1``),
  or never (``0``). By then forward's temporaries are freed, but glibc keeps their pages, and
  backward's allocations, of other sizes, often land elsewhere, so a step's resident peak
  holds both. The peak grows over a job's first steps and then stays, so by default the
  trims come in the first steps (the first 3-4 on a Zen 4, now and then one more later) and
  steady steps run untouched; a trim on every step costs speed, because backward faults the
  returned pages back in. Measured on a Zen 4 (bfloat16, three alternating processes each,
  peak MB; ``benchmark/results/native-amd-epyc-zen4/trim-growth-a5fd077.md``):

  ======================  ===========  ============  =========  ==================
  workload                growth       every step    never      without mxamp
  ======================  ===========  ============  =========  ==================
  MLP, ``amp.init``       672-680      675-678       702-726    reference 685-710
  MLP, O2                 586-594                    595-602    float32 598-604
  ResNet-50, O2           1453-1471    1444-1472     1420-1454  float32 2177-2217
  ======================  ===========  ============  =========  ==================

  On every step, the MLP's fastest step took 7-10% longer (311-322 ms against 289-292,
  ``trim-heap-b628251.md``).

>>> isinstance(release_free_memory(), bool)
True
"""
import ctypes
import ctypes.util
import gc
import platform
import resource

from mxamp.backend import env
from mxamp.backend.cpu import ONEDNN_SWITCH_ENV, classify_bf16, onednn_isa_cap

#: How many CPU temp-space buffers mxamp asks MXNet for, where the user set neither variable.
CPU_TEMP_COPIES = 1


def cpu_temp_space():
    """MXNet's CPU temp-space buffers in this process, in words, and who chose them.

    >>> 'MXNET_CPU_TEMP_COPY' in cpu_temp_space()
    True
    """
    return env.in_force("MXNET_CPU_TEMP_COPY", "MXNet's default, 4 buffers")


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
    if env.value("MXNET_CPU_TEMP_COPY", environ) is not None or \
            env.value("MXNET_CPU_WORKER_NTHREADS", environ) is not None:
        return ""
    return env.choose("MXNET_CPU_TEMP_COPY", CPU_TEMP_COPIES, "one CPU temp-space buffer: "
                      "MXNet runs CPU operators on one thread", environ)


#: How many oneDNN primitives per operator type MXNet keeps where mxamp bounds its cache.
PRIMITIVE_CACHE_SIZE = 0


def primitive_cache():
    """MXNet's oneDNN primitive cache in this process, in words, and who chose it.

    >>> 'MXNET_MKLDNN_CACHE_NUM' in primitive_cache()
    True
    """
    return env.in_force("MXNET_MKLDNN_CACHE_NUM", "MXNet's default, every primitive kept")


def bound_primitive_cache(flags, environ=None, machine=None):
    """Set ``MXNET_MKLDNN_CACHE_NUM=0`` (see the module's docstring) where it is unset and this
    process's bfloat16 class will be ``native`` (AVX512-BF16, no AMX: the CPU ``flags`` and
    the ISA cap oneDNN will read decide, as :func:`~mxamp.backend.cpu.classify_bf16` and
    :func:`~mxamp.backend.cpu.onednn_isa_cap` model them); returns what it did, in words ('' when it left MXNet alone).

    Only there was it measured: on AMX tiles the primitives and their scratch differ, emulated
    bfloat16 is not what an AVX-512 user runs, and float32's scratch is small (22 MB on
    ResNet-50). MXNet reads the variable at each operator type's first primitive, so ``import
    mxamp`` sets it before anything runs one. ``MXNET_MKLDNN_CACHE_NUM=-1`` keeps MXNet's
    default.

    >>> bf16 = {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni', 'avx512_bf16'}
    >>> bound_primitive_cache(bf16, environ={'MXNET_MKLDNN_CACHE_NUM': '-1'})
    ''
    >>> bound_primitive_cache(bf16, environ={'DNNL_MAX_CPU_ISA': 'AVX512_CORE'})   # emulated
    ''
    >>> amx = bf16 | {'amx_bf16', 'amx_tile', 'amx_int8'}
    >>> bound_primitive_cache(amx, environ={})    # mxamp will ask for AMX
    ''
    >>> e = {'MXAMP_AMX': '0'}; bound_primitive_cache(amx, environ=e)
    "MXNET_MKLDNN_CACHE_NUM=0 (one oneDNN primitive per operator type: a bfloat16 model's scratch lives while its operator runs)"
    >>> e['MXNET_MKLDNN_CACHE_NUM']
    '0'
    """
    if env.value("MXNET_MKLDNN_CACHE_NUM", environ) is not None:
        return ""
    bf16_class, _ = classify_bf16(flags, onednn_isa_cap(flags, environ),
                                  onednn=env.flag(ONEDNN_SWITCH_ENV, environ),
                                  machine=machine or platform.machine())
    if bf16_class != "native":
        return ""
    return env.choose("MXNET_MKLDNN_CACHE_NUM", PRIMITIVE_CACHE_SIZE, "one oneDNN primitive "
                      "per operator type: a bfloat16 model's scratch lives while its "
                      "operator runs", environ)


_LIBC = {}


def _libc_function(name):
    """glibc's function ``name``, or None where the C library has none (musl, macOS)."""
    if name not in _LIBC:
        try:
            _LIBC[name] = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
        except (OSError, AttributeError):
            _LIBC[name] = None
    return _LIBC[name]


def _malloc_trim():
    return _libc_function("malloc_trim")


#: glibc malloc arenas mxamp asks for where the user did not set ``MALLOC_ARENA_MAX``.
MALLOC_ARENAS = 1
_M_ARENA_MAX = -8   # glibc's mallopt parameter number for the arena limit


def c_heap_arenas():
    """glibc's malloc arenas in this process, in words, and who chose them.

    >>> 'MALLOC_ARENA_MAX' in c_heap_arenas()
    True
    """
    return env.in_force("MALLOC_ARENA_MAX", "glibc's default, up to 8 per core")


def share_one_c_heap(environ=None):
    """Ask glibc for one malloc arena where ``MALLOC_ARENA_MAX`` is unset (see the module's
    docstring); returns what it did, in words ('' where it left glibc alone, or where the C
    library is not glibc).

    glibc reads the variable when a process starts, so mxamp calls ``mallopt`` for this
    process and sets the variable for its children. It must come before MXNet's threads
    first allocate: ``import mxamp`` calls it before importing MXNet. Set
    ``MALLOC_ARENA_MAX`` yourself (``8`` per core is glibc's default) to keep your own.

    >>> share_one_c_heap(environ={'MALLOC_ARENA_MAX': '8'})
    ''
    """
    if env.value("MALLOC_ARENA_MAX", environ) is not None:
        return ""
    mallopt = _libc_function("mallopt")
    if mallopt is None or not mallopt(_M_ARENA_MAX, MALLOC_ARENAS):
        return ""
    return env.choose("MALLOC_ARENA_MAX", MALLOC_ARENAS, "one glibc malloc arena: MXNet's "
                      "threads share the heap that frees blocks for each other", environ)


#: glibc's automatic trim: where the free top of the heap exceeds this many bytes, ``free``
#: gives it back. No benchmark workload's free top reached 256 MB (faults and steps matched
#: 2 GiB's on all four), so pages go back when mxamp trims (:func:`trim_after_forward`,
#: :func:`release_before_first_call`), or where a process frees more than that at once.
TRIM_THRESHOLD = 256 * 2 ** 20
#: Blocks from this size up are mapped on their own and unmapped when freed (glibc adapts its
#: own threshold up to 32 MB, which a fixed trim threshold turns off): at 16 MB ResNet-50's
#: peak stayed where it was with glibc's trims, at 32 MB it rose 3-6% (module docstring).
MMAP_THRESHOLD = 16 * 2 ** 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameter numbers
_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold")


def freed_pages():
    """Whether glibc gives freed pages back on its own in this process, in words, and who
    chose it.

    >>> 'MALLOC_TRIM_THRESHOLD_' in freed_pages()
    True
    """
    return env.in_force("MALLOC_TRIM_THRESHOLD_", "glibc's default, freed pages go back as "
                        "the heap's free top grows past a threshold glibc adapts")


def keep_freed_pages(environ=None):
    """Turn glibc's automatic trim off (see the module's docstring) where the user set neither
    threshold (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_`` or their
    ``GLIBC_TUNABLES``); returns what it did, in words ('' where it left glibc alone, or where
    the C library is not glibc).

    A fixed trim threshold also fixes glibc's mmap threshold, which it otherwise raises as
    large blocks are freed, so mxamp sets that too (:data:`MMAP_THRESHOLD`). mxamp
    calls ``mallopt`` for this process and sets both variables for its children.

    >>> keep_freed_pages(environ={'MALLOC_TRIM_THRESHOLD_': '131072'})
    ''
    >>> keep_freed_pages(environ={'GLIBC_TUNABLES': 'glibc.malloc.mmap_threshold=65536'})
    ''
    """
    tunables = env.value("GLIBC_TUNABLES", environ) or ""
    if env.value("MALLOC_TRIM_THRESHOLD_", environ) is not None or \
            env.value("MALLOC_MMAP_THRESHOLD_", environ) is not None or \
            any(name in tunables for name in _TUNABLES):
        return ""
    mallopt = _libc_function("mallopt")
    if mallopt is None or not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
                               mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return ""
    env.choose("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD, "blocks of 16 MB and more are "
               "mapped on their own", environ)
    return env.choose("MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD, "glibc keeps freed pages; "
                      "they go back when mxamp trims the heap", environ)


def release_free_memory():
    """Collect Python's garbage, wait for MXNet to free what that dropped, then give the C
    heap's free pages back; True if trimmed."""
    import mxnet as mx   # here: import mxamp loads this module before MXNet, to set its variables
    gc.collect()
    # MXNet frees an array's storage on its engine's thread, after the last reference went
    # (under DNNL_MAX_CPU_ISA=AVX2, 1 of 5 processes converting a model trimmed before the
    # model it replaced was freed)
    mx.nd.waitall()
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


def release_before_first_call(environ=None):
    """:func:`release_free_memory` unless ``MXAMP_TRIM_HEAP`` is ``0`` (the module's
    docstring: what a model that a conversion replaced leaves in the heap); True if trimmed.

    >>> release_before_first_call(environ={'MXAMP_TRIM_HEAP': '0'})
    False
    """
    return trim_policy(environ) != NEVER and release_free_memory()


#: The default trims when the process's resident peak grew by more than this share since
#: the last trim: a peak that creeps by a page now and then is left alone (after its first
#: steps, the Zen 4's MLP grew by 0-2 MB a step, which a trim would not have saved).
PEAK_GROWTH = 0.01
_LAST_TRIM_PEAK_KB = [0]   # the resident peak at the last trim of trim_after_forward

#: What ``MXAMP_TRIM_HEAP`` asks for: unset, on and off.
TRIM_POLICIES = ON_PEAK_GROWTH, EVERY_STEP, NEVER = ("on peak growth", "every step", "never")


def trim_policy(environ=None):
    """When :func:`trim_after_forward` trims, by ``MXAMP_TRIM_HEAP``: one of
    :data:`TRIM_POLICIES`.

    >>> [trim_policy(e) for e in ({}, {'MXAMP_TRIM_HEAP': '1'}, {'MXAMP_TRIM_HEAP': 'off'})]
    ['on peak growth', 'every step', 'never']
    """
    if env.value("MXAMP_TRIM_HEAP", environ) is None:
        return ON_PEAK_GROWTH
    return EVERY_STEP if env.flag("MXAMP_TRIM_HEAP", environ) else NEVER


def _peak_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KB on Linux


def trim_after_forward(losses, environ=None):
    """Where ``losses`` are on the CPU and :func:`trim_policy` says so: wait for them (forward
    is then over) and give the C heap's free pages back (see the module's docstring); True
    where it trimmed. ``amp.scale_loss`` calls it every step; where it does not trim, it costs
    a look at the process's peak.

    >>> trim_after_forward([], environ={'MXAMP_TRIM_HEAP': '0'})
    False
    >>> trim_after_forward([], environ={'MXAMP_TRIM_HEAP': '1'}) == (_malloc_trim() is not None)
    True
    """
    trim = _malloc_trim()
    policy = trim_policy(environ)
    if trim is None or policy == NEVER:
        return False
    if any(loss.context.device_type != "cpu" for loss in losses):
        return False   # a GPU's memory is not the C heap's, and a wait would stall its queue
    peak = _peak_kb()
    if policy == ON_PEAK_GROWTH and peak <= _LAST_TRIM_PEAK_KB[0] * (1 + PEAK_GROWTH):
        return False
    for loss in losses:
        loss.wait_to_read()
    trim(0)   # 1 where pages went back, 0 where none were free: trimmed either way
    _LAST_TRIM_PEAK_KB[0] = peak
    return True
