"""MXNet's own storage counter, for the tests that count bytes in a child process.

MXNet's profiler keeps a ``Memory: cpu/0`` counter that sees every allocation and free of
MXNet's CPU storage. :data:`GROWTH_SOURCE` is Python source that a child's script starts
with (children import MXNet themselves, first, as scripts do). It defines
``storage_trace(run)``: the counter's values in bytes while ``run()`` runs once, the start
(zero) first; and ``storage_growth_mb(run)``: how far the counter climbs above its start, in
MB. MXNet finishes one profiler trace per process, so a child calls one of them once.

The counter starts at zero when profiling starts (MXNet's ``storage_profiler.h``), and its
trace holds the value after each allocation or free, never the start. So the start is zero,
not the first value: that one is the first event's, and which event comes first depends on
the engine's threads (a late free of an earlier array, clamped at zero, or an allocation).
Reading the first value as the start made one CI run count a step 1 MB above another.
"""

GROWTH_SOURCE = """
def storage_trace(run):
    import gc, json, os, tempfile
    import mxnet as mx
    gc.collect()     # arrays in reference cycles go now, not freed during run()
    mx.nd.waitall()
    handle, path = tempfile.mkstemp(suffix='.json')
    os.close(handle)
    mx.profiler.set_config(profile_memory=True, profile_symbolic=False,
                           profile_imperative=False, profile_api=False, filename=path)
    mx.profiler.set_state('run')
    run()
    mx.nd.waitall()
    mx.profiler.set_state('stop')
    mx.profiler.dump()
    with open(path) as f:
        events = json.load(f)['traceEvents']
    os.remove(path)
    counter = sorted((e for e in events if e.get('ph') == 'C'
                      and e['name'].startswith('Memory: cpu')), key=lambda e: e['ts'])
    return [0] + [e['args'][e['name']] for e in counter]


def storage_growth_mb(run):
    return max(storage_trace(run)) / 2 ** 20
"""
