"""Independent child processes of a test, run side by side.

Most of the suite's time is child interpreters importing MXNet (about 2 s each on the 2-core
Zen 4), and each child's import runs on one core. Children whose results do not depend on
timing run together, as many at once as this machine has CPUs. A child that times something
(the probe behind ``'auto'``, ``amp.tune``, a speed column) runs alone, as before.
"""
import concurrent.futures
import os


def map_side_by_side(function, items):
    """``[function(item) for item in items]``, with up to one call per CPU at a time.

    >>> map_side_by_side(lambda n: n * n, [1, 2, 3])
    [1, 4, 9]
    """
    items = list(items)
    workers = max(1, min(len(items), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, items))
