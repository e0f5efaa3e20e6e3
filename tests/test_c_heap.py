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


def _arenas(run):
    who, environ = run
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update(environ)
    proc = subprocess.run([sys.executable, "-c", _ARENAS_RUN, who], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    setting, arenas = proc.stdout.split()
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
