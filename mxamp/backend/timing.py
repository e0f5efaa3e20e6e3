"""The one timing loop: the AMX check, the machine probe, the doctor and ``amp.tune`` time here.

Every call timed must finish its work before it returns (``wait_to_read()``, ``asnumpy()``):
MXNet runs operators asynchronously, and an unsynchronised call times only its launch.

>>> t = time_calls(lambda: sum(range(1000)), repeats=5)
>>> len(t.samples), t.best <= t.median
(5, True)
"""
import time


class Timing:
    """Seconds per timed call, in the order they ran (warm-up calls excluded).

    A plain class, not a dataclass, and no ``statistics``: ``import mxamp`` loads this module,
    and both cost ~2 ms of import time.
    """

    __slots__ = ("samples",)

    def __init__(self, samples):
        self.samples = tuple(samples)

    @property
    def best(self):
        """The fastest call: the least disturbed by the rest of the machine."""
        return min(self.samples)

    @property
    def median(self):
        ordered, middle = sorted(self.samples), len(self.samples) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2

    @property
    def total(self):
        return sum(self.samples)


def time_calls(call, repeats=3, warmup=1, min_seconds=0.0, at_most=None, stop=None):
    """Time ``call()`` after ``warmup`` untimed calls (primitive creation, allocation).

    It runs at least ``repeats`` timed calls and keeps going until they add up to
    ``min_seconds``, but never past ``at_most`` calls; ``stop(samples)`` returning True ends
    it early (a candidate already slower than the best one, say).

    >>> time_calls(lambda: None, repeats=2, warmup=0, stop=lambda s: True).samples[0] >= 0
    True
    """
    for _ in range(warmup):
        call()
    samples = []
    while True:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
        if at_most is not None and len(samples) >= at_most:
            break
        if stop is not None and stop(samples):
            break
        if len(samples) >= repeats and sum(samples) >= min_seconds:
            break
    return Timing(samples)


_PROFILE_DIR = []


def profile_file():
    """A file of mxamp's own for MXNet's profiler trace, which ``amp.tune`` never reads (it
    reads the aggregate table). Not os.devnull: stopping the profiler deletes its file and
    writes a new one, which as root replaced /dev/null with a regular file (seen on this
    project's CI). The folder is removed when the process that made it exits."""
    import atexit
    import os
    import shutil
    import tempfile
    if not _PROFILE_DIR:
        folder = tempfile.mkdtemp(prefix="mxamp-tune-")
        atexit.register(shutil.rmtree, folder, True)
        _PROFILE_DIR.append(folder)
    return os.path.join(_PROFILE_DIR[0], "profile.json")


def costliest_ops(dump, steps, count=5):
    """``[[op, ms per step], ...]``: the ``count`` costliest operators of MXNet's aggregate
    profile ``dump`` (its JSON), over ``steps`` timed passes.

    >>> costliest_ops('{"Time": {"operator": {"Convolution": {"Total": 8.0}}}}', 2)
    [['Convolution', 4.0]]
    """
    import json
    try:
        ops = json.loads(dump)["Time"].get("operator", {})
    except (ValueError, KeyError):
        return []
    ranked = sorted(ops.items(), key=lambda kv: -kv[1].get("Total", 0))[:count]
    return [[name, round(stats["Total"] / max(steps, 1), 2)] for name, stats in ranked]
