"""Every environment variable mxamp reads, in one table, and the one parser of on/off values.

mxamp reads the environment here only: its own switches (``MXAMP_*``) and the few MXNet,
oneDNN and XDG variables whose meaning it must follow. The few MXNet and glibc variables that
``import mxamp`` sets where you did not are set through :func:`choose`, which remembers them,
so that :func:`in_force` can tell the doctor who chose each. The README's table of environment
variables lists the same names (``tests/test_docs.py`` compares them). Nothing here imports
MXNet: the CPU's class is read before MXNet runs its first oneDNN primitive.

>>> flag('MXAMP_PROBE', environ={'MXAMP_PROBE': 'off'})
False
>>> flag('MXAMP_PROBE', environ={})            # unset: the variable's default
True
"""
import logging
import os

_LOG = logging.getLogger("mxamp")

#: Words that mean "on" and "off" (case-insensitive); an empty value is off.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")

#: name -> (default when unset, what it does). The default of an on/off switch is a bool.
VARIABLES = {
    "MXAMP_AMX": (True, "off: keep oneDNN off AMX tiles (set before importing mxamp; AMX "
                        "needs Linux >= 5.16 and a CPU with amx_bf16)"),
    "MXAMP_DISABLE_AMX": (False, "on: never touch oneDNN's ISA (the 0.1.0 opt-out; wins over "
                                 "MXAMP_AMX)"),
    "MXAMP_PROBE": (True, "off: 'auto' follows the CPU class alone, no measurement"),
    "MXAMP_PROBE_CACHE": (True, "off: the probe neither reads nor writes its cache file; a "
                                "path (with a '/' or ending in .json): the cache file to use"),
    "MXAMP_REPROBE": (False, "on: measure again even where the cache has a result"),
    "MXAMP_TRIM_HEAP": (None, "when amp.scale_loss gives the C heap's free pages back, between "
                              "forward and backward on the CPU; unset: on the steps where the "
                              "process's peak grew; on: every step (slower); off: never "
                              "(see README, Memory)"),
    "MXAMP_TUNE_FORK": (True, "off: amp.tune times its candidates in this process instead of a "
                              "forked copy (their memory then stays with the process)"),
    "DNNL_MAX_CPU_ISA": (None, "oneDNN's ISA cap (AVX2, AVX512_CORE, AVX512_CORE_BF16, "
                               "AVX512_CORE_AMX); a cap you set wins over mxamp's"),
    "MKLDNN_MAX_CPU_ISA": (None, "the older spelling of DNNL_MAX_CPU_ISA"),
    "MXNET_MKLDNN_ENABLED": (True, "off: MXNet's oneDNN operators are off, so no bfloat16 "
                                   "kernels (class 'none')"),
    "MXNET_CPU_TEMP_COPY": (None, "MXNet's CPU temp-space buffers (MXNet's default 4); where "
                                  "it and MXNET_CPU_WORKER_NTHREADS are unset, import mxamp "
                                  "sets 1 (see README, Memory)"),
    "MXNET_MKLDNN_CACHE_NUM": (None, "oneDNN primitives MXNet keeps per operator type (MXNet's "
                                     "default -1, all); where unset and the class is 'native' "
                                     "(AVX512-BF16, no AMX asked for), import mxamp sets 0 "
                                     "(see README, Memory)"),
    "MXNET_CPU_WORKER_NTHREADS": (None, "MXNet's CPU worker threads (default 1); set, mxamp "
                                        "leaves MXNET_CPU_TEMP_COPY alone"),
    "MXNET_UPDATE_ON_KVSTORE": (True, "MXNet's choice of where a dist kvstore updates; "
                                      "mxamp's overflow agreement follows it"),
    "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD": (None, "operators per segment of MXNet's bulked "
                                                      "backward pass (default 15); where it, "
                                                      "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN and "
                                                      "MXNET_EXEC_BULK_EXEC_TRAIN are unset, "
                                                      "graphs without convolutions that AMP "
                                                      "builds for the CPU get 1 (see README, "
                                                      "Memory)"),
    "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN": (None, "MXNet's segment size for both passes of "
                                                  "training (default 15); set, mxamp leaves "
                                                  "the backward segments alone"),
    "MXNET_EXEC_BULK_EXEC_TRAIN": (None, "MXNet's bulked execution in training (default on); "
                                         "set, mxamp leaves the backward segments alone"),
    "NNVM_EXEC_MATCH_RANGE": (None, "how far apart in size two arrays of an MXNet graph may be "
                                    "and share a storage block (MXNet's default 16); set, "
                                    "mxamp leaves MXNet's memory plans alone"),
    "NNVM_AUTO_SEARCH_MATCH_RANGE": (None, "on: MXNet plans each graph's memory with every "
                                           "match range from 1 to NNVM_EXEC_MATCH_RANGE and "
                                           "keeps the plan that allocates least; where it and "
                                           "NNVM_EXEC_MATCH_RANGE are unset, import mxamp sets "
                                           "1 (see README, Memory)"),
    "MALLOC_ARENA_MAX": (None, "glibc's malloc arenas (default up to 8 per core); where unset, "
                               "import mxamp asks glibc for one (see README, Memory)"),
    "MALLOC_TRIM_THRESHOLD_": (None, "glibc gives the heap's free top back past this many "
                                     "bytes (default: a threshold glibc adapts); where it, "
                                     "MALLOC_MMAP_THRESHOLD_ and their GLIBC_TUNABLES are "
                                     "unset, import mxamp sets 256 MB, so that pages go "
                                     "back when mxamp trims (see README, Memory)"),
    "MALLOC_MMAP_THRESHOLD_": (None, "glibc maps blocks of this size and more on their own "
                                     "(default: adapted up to 32 MB); import mxamp sets 16 MB "
                                     "with MALLOC_TRIM_THRESHOLD_"),
    "GLIBC_TUNABLES": (None, "glibc's settings; one that names glibc.malloc.trim_threshold or "
                             "glibc.malloc.mmap_threshold keeps mxamp off both thresholds"),
    "XDG_CACHE_HOME": (None, "where the probe's cache lives (default ~/.cache): "
                             "$XDG_CACHE_HOME/mxamp/probe.json"),
    "OMP_NUM_THREADS": (None, "threads per process; part of the probe's cache key"),
}


def value(name, environ=None):
    """The raw value of ``name`` (None when unset). Only names of :data:`VARIABLES`.

    >>> value('DNNL_MAX_CPU_ISA', environ={'DNNL_MAX_CPU_ISA': 'AVX2'})
    'AVX2'
    """
    if name not in VARIABLES:
        raise KeyError("mxamp reads no environment variable %r; add it to "
                       "mxamp.backend.env.VARIABLES and the README's table" % name)
    return (os.environ if environ is None else environ).get(name)


def flag(name, environ=None):
    """The on/off value of ``name``: its default when unset, False for an empty value or
    one of :data:`FALSE_WORDS`, True for :data:`TRUE_WORDS`; any other word counts as on,
    with a warning that names the accepted words.

    >>> flag('MXAMP_AMX', environ={'MXAMP_AMX': 'NO'})
    False
    """
    raw = value(name, environ)
    if raw is None:
        return bool(VARIABLES[name][0])
    word = raw.strip().lower()
    if word in FALSE_WORDS:
        return False
    if word not in TRUE_WORDS and not (name in PATH_VARIABLES and path_value(name, environ)):
        _LOG.warning("%s=%r is not one of %s; treating it as set", name, raw,
                     "/".join(TRUE_WORDS))
    return True


#: On/off switches that also take a file's path (which means on, and where).
PATH_VARIABLES = ("MXAMP_PROBE_CACHE",)


def path_value(name, environ=None):
    """The value of ``name`` where it is a file's path (it has a ``/`` or ends in ``.json``),
    else None.

    >>> path_value('MXAMP_PROBE_CACHE', environ={'MXAMP_PROBE_CACHE': '/tmp/probe.json'})
    '/tmp/probe.json'
    >>> path_value('MXAMP_PROBE_CACHE', environ={'MXAMP_PROBE_CACHE': '1'}) is None
    True
    """
    raw = (value(name, environ) or "").strip()
    return raw if ("/" in raw or os.sep in raw or raw.endswith(".json")) else None


#: variable -> (value, in words) that mxamp chose in this process (for the doctor)
_CHOSEN_BY_MXAMP = {}


def choose(name, chosen, why, environ=None):
    """Set ``name`` to ``chosen`` in ``environ`` (for MXNet, glibc and child processes) on
    mxamp's behalf; returns the choice in words. Callers first check that the user set
    nothing.

    >>> e = {}; choose('MALLOC_ARENA_MAX', 1, 'one arena', environ=e), e
    ('MALLOC_ARENA_MAX=1 (one arena)', {'MALLOC_ARENA_MAX': '1'})
    """
    value(name, environ)   # only names of VARIABLES
    environ = os.environ if environ is None else environ
    environ[name] = str(chosen)
    said = "%s=%s (%s)" % (name, chosen, why)
    if environ is os.environ:
        _CHOSEN_BY_MXAMP[name] = (str(chosen), said)
    _LOG.debug("mxamp: set %s", said)
    return said


def in_force(name, default, environ=None):
    """The setting ``name`` in this process (or ``environ``), in words, and who chose it
    (``default``: what an unset variable means).

    >>> in_force('MALLOC_ARENA_MAX', "glibc's default", environ={})
    "MALLOC_ARENA_MAX unset: glibc's default"
    >>> in_force('MALLOC_ARENA_MAX', "glibc's default", environ={'MALLOC_ARENA_MAX': '2'})
    'MALLOC_ARENA_MAX=2, yours'
    """
    chosen = value(name, environ)
    if chosen is None:
        return "%s unset: %s" % (name, default)
    ours = environ is None or environ is os.environ
    if ours and _CHOSEN_BY_MXAMP.get(name, (None,))[0] == chosen:
        return "set by import mxamp: " + _CHOSEN_BY_MXAMP[name][1]
    return "%s=%s, yours" % (name, chosen)
