"""Calls in a forked copy of this process, so that what they allocate ends with the copy.

``amp.tune`` times each candidate policy this way. A trial builds the candidate's graph, its
cast copies, its activations at the full batch and the oneDNN kernels for its dtypes; run in
the user's process, all of that raised the process's peak for good (ResNet-50 training peaked
at 2720 MB after tuning against 1621 MB untuned, float32's activations being the largest
trial). In a child, the memory returns to the system when the child exits, the model in the
parent is never touched, and a kernel that crashes ends the child instead of the user's
process.

The child shares the parent's pages until it writes them (copy-on-write), so while a trial runs
the machine holds the parent, plus what the trial allocates, plus the pages it writes (the
gradients). MXNet 1.9 stops and restarts its engine around ``fork`` (its ``pthread_atfork``
handlers), and oneDNN's OpenMP threads run in the child at the parent's speed: a 64-channel
3x3 convolution took 0.093 ms in the child against 0.097 in the parent after the child's first
call (2 threads, Zen 4, 2026-11-26). CUDA does not survive ``fork``, so GPU work stays in the
process; so does everything where ``os.fork`` does not exist.

>>> call_in_fork(lambda: 6 * 7) if FORK_AVAILABLE else 42
42
"""
import os
import pickle
import signal
import sys
import traceback
import warnings

#: Whether this Python can fork (POSIX).
FORK_AVAILABLE = hasattr(os, "fork")


class ForkedCallDied(RuntimeError):
    """The forked copy ended without a result: a signal (a crash in a kernel) or ``os._exit``."""


def without_core_dump():
    """In a forked child that may crash, on purpose (a probe) or by a kernel's fault (a trial):
    no core file. Where the system writes them, a core of the copy holds the parent's whole
    memory (a training process: gigabytes), written before the parent learns of the crash."""
    try:
        import resource   # pylint: disable=import-outside-toplevel
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass   # no such limit here: the system's setting stands


def _child(fn, write_fd):
    """Run ``fn`` and send ('ok', value) or ('error', exception, traceback text); never return."""
    code = 0
    without_core_dump()
    try:
        try:
            outcome = ("ok", fn())
        except BaseException as err:  # noqa: BLE001 - sent to the parent, which raises it
            outcome = ("error", err, traceback.format_exc())
        try:
            payload = pickle.dumps(outcome)
            pickle.loads(payload)   # an exception whose class cannot be rebuilt fails here
        except Exception:  # noqa: BLE001 - what does not pickle goes as text
            text = outcome[2] if outcome[0] == "error" else traceback.format_exc()
            payload = pickle.dumps(("error", None, text))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
    except BaseException:  # noqa: BLE001 - nothing may return into the parent's code
        code = 1
    finally:
        try:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()   # what the call printed (os._exit flushes nothing)
        finally:
            os._exit(code)  # no atexit handlers of the parent's


def _wait(pid):
    """How the child ended, in words ('' for a clean exit)."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "signal %d" % number
        # SIGKILL is also how Linux's out-of-memory killer ends a process
        return "killed by %s%s" % (name, " (out of memory?)" if name == "SIGKILL" else "")
    code = os.WEXITSTATUS(status)
    return "" if code == 0 else "exit status %d" % code


def call_in_fork(fn):
    """``fn()`` run in a forked copy of this process; its return value comes back by pickle.

    An exception in the child is raised again here (with the child's traceback as a note); a
    child that dies without a result raises :class:`ForkedCallDied` naming the signal.

    >>> import mxnet as mx
    >>> call_in_fork(lambda: float(mx.nd.ones((2, 2)).sum().asscalar())) if FORK_AVAILABLE \\
    ...     else 4.0
    4.0
    """
    read_fd, write_fd = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()   # else the child's exit would not write them, but its own prints would
    with warnings.catch_warnings():
        # Python 3.12 warns that forking a threaded process may deadlock; MXNet's engine is
        # stopped and restarted around fork by its own handlers, which is what makes it safe
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(fn, write_fd)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
    finally:
        ended = _wait(pid)   # also after Ctrl-C here, which the child got too: no zombie
    if not payload:
        raise ForkedCallDied("the forked process ended without a result (%s)" % (
            ended or "no output"))
    outcome = pickle.loads(payload)
    if outcome[0] == "ok":
        return outcome[1]
    err = outcome[1] if isinstance(outcome[1], BaseException) else RuntimeError(
        "in the forked process:\n%s" % outcome[2])
    if hasattr(err, "add_note"):
        err.add_note("raised in mxamp's forked process; its traceback:\n%s" % outcome[2])
    raise err
