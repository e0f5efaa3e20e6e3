"""One glibc malloc arena: ``import mxamp`` asks glibc for it where ``MALLOC_ARENA_MAX`` is
unset (``mxamp/backend/heap.py``, ``share_one_c_heap``).

The count comes from glibc itself: ``malloc_info`` writes one ``<heap nr=...>`` element per
arena. Decisions and counts only; nothing is timed.
"""
import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

from side_by_side import map_side_by_side

_ARENAS_RUN = r"""
import ctypes, re, sys, tempfile, threading
if sys.argv[1] == 'mxamp':
    import mxamp  # noqa: F401
import os
libc = ctypes.CDLL('libc.so.6')
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p

def allocate():   # a thread's first malloc gives it an arena, a new one while glibc may
    libc.free(libc.malloc(1 << 20))

threads = [threading.Thread(target=allocate) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.NamedTemporaryFile(suffix='.xml') as report:
    stream = libc.fopen(report.name.encode(), b'w')
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    arenas = len(re.findall(r'<heap nr=', open(report.name).read()))
print(os.environ.get('MALLOC_ARENA_MAX'), arenas)
"""


def _glibc():
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_info")
    except OSError:
        return False


def _child(script, run, unset):
    """The words ``script`` prints in a fresh interpreter, run as ``(who, environ)``: ``who``
    is its argument, ``environ`` its variables beyond this process's, less ``unset``."""
    who, environ = run
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(environ)
    proc = subprocess.run([sys.executable, "-c", script, who], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def _arenas(run):
    setting, arenas = _child(_ARENAS_RUN, run, ("MALLOC_ARENA_MAX",))
    return setting, int(arenas)


@pytest.mark.skipif(not _glibc(), reason="needs glibc (malloc_info)")
def test_import_mxamp_leaves_one_malloc_arena_unless_told_otherwise():
    """Three threads allocate after the import. Without mxamp glibc gives them arenas of
    their own (4 in all on the Zen 4: the main one and three); with mxamp, one. A user's
    MALLOC_ARENA_MAX is kept, and glibc, which read it at start, follows it."""
    runs = [("plain", {}), ("mxamp", {}), ("mxamp", {"MALLOC_ARENA_MAX": "2"})]
    (_, plain), (setting, shared), (kept, users) = map_side_by_side(_arenas, runs)
    assert plain >= 2, "without mxamp glibc made %d arena(s): the check cannot tell" % plain
    assert (setting, shared) == ("1", 1), (
        "with mxamp: MALLOC_ARENA_MAX=%s and %d arenas, expected 1 and 1" % (setting, shared))
    assert kept == "2" and users == 2, (
        "the user's MALLOC_ARENA_MAX=2 became %s, with %d arenas" % (kept, users))


# Four blocks of 12 MB (48 MB), written and freed. In a fresh process glibc maps each block of
# 128 KB or more on its own (its mmap threshold, until it adapts) and unmaps it when freed;
# with mxamp's thresholds (16 MB, and a trim threshold of 256 MB) the blocks come from the heap
# and their pages stay until a malloc_trim. Resident pages from the kernel
# (/proc/self/statm), in MB: what went back after the frees, then after malloc_trim(0).
_FREED_RUN = r"""
import ctypes, os, sys
if sys.argv[1] == 'mxamp':
    import mxamp  # noqa: F401
libc = ctypes.CDLL('libc.so.6')
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
page = os.sysconf('SC_PAGE_SIZE') / 2.0 ** 20

def resident():
    with open('/proc/self/statm') as statm:
        return int(statm.read().split()[1]) * page

blocks = [0] * 4
for i in range(len(blocks)):
    blocks[i] = libc.malloc(12 << 20)
    libc.memset(blocks[i], 1, 12 << 20)
held = resident()
for block in blocks:
    libc.free(block)
freed = resident()
libc.malloc_trim(0)
print(os.environ.get('MALLOC_TRIM_THRESHOLD_'), held - freed, held - resident())
"""


def _freed(run):
    setting, at_free, at_trim = _child(
        _FREED_RUN, run, ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"))
    return setting, float(at_free), float(at_trim)


@pytest.mark.skipif(not _glibc(), reason="needs glibc (malloc_info)")
def test_import_mxamp_keeps_freed_pages_until_it_trims_unless_told_otherwise():
    """Without mxamp, glibc returns the 48 MB as they are freed (measured on the Zen 4: 48.0
    MB); after ``import mxamp`` they stay resident (0.0 MB) until ``malloc_trim`` gives them
    back (48.0 MB), as mxamp's own trims do. A user's MALLOC_TRIM_THRESHOLD_ is kept, and
    glibc follows it (48.0 MB at free). Each bound is 40 of the 48 MB, and 5 MB for "stays"."""
    runs = [("plain", {}), ("mxamp", {}), ("mxamp", {"MALLOC_TRIM_THRESHOLD_": "131072"})]
    plain, ours, users = map_side_by_side(_freed, runs)
    assert plain[1] > 40, "without mxamp glibc gave back %.1f MB at free: the check cannot " \
        "tell" % plain[1]
    assert ours[0] == str(256 << 20) and ours[1] < 5 and ours[2] > 40, (
        "with mxamp (MALLOC_TRIM_THRESHOLD_=%s): %.1f MB went back at free, %.1f MB by "
        "malloc_trim; expected under 5 and over 40" % ours)
    assert users[0] == "131072" and users[1] > 40, (
        "the user's MALLOC_TRIM_THRESHOLD_=131072 became %s, and %.1f MB went back at free"
        % users[:2])
