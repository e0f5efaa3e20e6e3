"""The tests' storage counter (``tests/storage_counter.py``) against allocations of known size.

Its expectations are arithmetic: float32 arrays of 2**18 and 2**19 elements hold 1 and 2 MB.
"""
import json
import subprocess
import sys

from storage_counter import GROWTH_SOURCE

_CHILD = """
import json
import mxnet as mx
kept = []

def allocate():
    kept.append(mx.nd.ones((256, 1024)))     # 1 MB, the trace's first event
    kept.append(mx.nd.ones((512, 1024)))     # 2 MB
    mx.nd.waitall()

print(json.dumps(storage_growth_mb(allocate)))
"""


def test_the_storage_counter_counts_from_zero_not_from_its_first_event():
    """MXNet's storage profiler starts its counter at zero and records the value after each
    event, so the first value already holds the first allocation. Two arrays of 1 and 2 MB
    kept alive grow storage by 3 MB; counting from the first value would say 2 (as the
    counter did until a CI run counted one step 1 MB apart from an identical one)."""
    proc = subprocess.run([sys.executable, "-c", GROWTH_SOURCE + _CHILD], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    growth = json.loads(proc.stdout.splitlines()[-1])
    assert abs(growth - 3.0) < 1e-6, "two arrays of 1 and 2 MB counted as %.3f MB" % growth
