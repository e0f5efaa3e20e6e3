"""MXNet's own storage counter, for the tests that count bytes in a child process.

MXNet's profiler keeps a ``Memory: cpu/0`` counter that sees every allocation and free of
MXNet's CPU storage. :data:`GROWTH_SOURCE` is Python source that a child's script starts
with (children import MXNet themselves, first, as scripts do); it defines
``storage_growth_mb(run)``: how far the counter climbs above its start while ``run()`` runs
once, in MB. MXNet finishes one profiler trace per process, so a child calls it once.
"""

GROWTH_SOURCE = """
def storage_growth_mb(run):
    import json, os, tempfile
    import mxnet as mx
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
    mb = [e['args'][e['name']] / 2 ** 20 for e in counter]
    return max(mb) - mb[0]
"""
