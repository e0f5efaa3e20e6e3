"""Where a benchmark process's bytes go: counted arrays, MXNet's storage counter, peak RSS.

``bench_worker.py`` calls these after its timed steps, so the accounting never perturbs a
timing. Three sources, each honest about what it sees:

* ``peak_mb``: the process's peak resident memory (``ru_maxrss``), what a user's machine
  sees. It includes memory the C allocator keeps after MXNet freed it.
* ``account``: exact bytes of the arrays the model and the trainer hold, counted from their
  shapes and dtypes: parameters, gradients, optimizer state (float32 masters included) and
  mxamp's float32 workspace.
* ``weight_casts_mb``: the low-precision copies of parameters that the hybridized graph makes
  every step (``amp_cast`` of a parameter), counted from the graph and the parameters'
  shapes. Autograd keeps each until the backward of the layer that used it, so they are part
  of the step's storage (below), beside the activations.
* ``step_storage_mb``: how far one step grows MXNet's own storage above its start (MXNet's
  storage profiler, its ``Memory: cpu/0`` counter, which sees every allocation and free).
  The worker profiles the second step: the first makes the optimizer state, mxamp's
  workspace and late-initialised parameters, which would otherwise count as the step's. What
  it measures is what the step's graph holds or passes through at its peak: activations
  kept for backward, cast copies, temporaries. MXNet's profiler finishes one trace per
  process, so one step is profiled.
"""
import json
import os
import resource
import sys
import tempfile

import numpy as np

MB = float(2 ** 20)
#: MXNet's bfloat16 dtype as numpy sees it.
BFLOAT16 = np.dtype([("bfloat16", "<u2")])


def peak_mb(sync=False):
    """The process's peak resident memory so far, in MB (``sync``: after MXNet's queued work)."""
    if sync:
        import mxnet as mx
        mx.nd.waitall()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _bytes(array):
    import mxnet as mx
    if not isinstance(array, mx.nd.NDArray):
        return 0
    return array.size * np.dtype(array.dtype).itemsize


def _state_bytes(state):
    if isinstance(state, (list, tuple)):
        return sum(_state_bytes(s) for s in state)
    return _bytes(state)


def counted_mb(row):
    """The MB an :func:`account` row counts in arrays."""
    return sum(row.get(k, 0.0) for k in ("params_mb", "grads_mb", "optimizer_mb",
                                         "workspace_mb"))


def account(net, trainer=None):
    """MB held by ``net``'s parameters (by dtype), their gradients, the trainer's optimizer
    state and mxamp's workspace."""
    by_dtype, grads, count = {}, 0, 0
    for param in net.collect_params().values():
        try:
            data = param.list_data()
        except Exception:  # noqa: BLE001 - a parameter never initialised holds nothing
            continue
        count += data[0].size
        for array in data:
            name = "bfloat16" if array.dtype == BFLOAT16 else np.dtype(array.dtype).name
            by_dtype[name] = by_dtype.get(name, 0) + _bytes(array)
        if param.grad_req != "null":
            grads += sum(_bytes(g) for g in param.list_grad())
    row = {"params_mb": sum(by_dtype.values()) / MB, "grads_mb": grads / MB,
           "params_by_dtype_mb": {k: round(v / MB, 2) for k, v in by_dtype.items()},
           "param_count": count}
    if trainer is not None:
        states = [s for u in getattr(trainer, "_updaters", []) for s in u.states.values()]
        row["optimizer_mb"] = sum(_state_bytes(s) for s in states) / MB
    # read only where mxamp is loaded: the reference's and float32's processes never import it
    casting = sys.modules.get("mxamp.runtime.casting")
    if casting is not None:
        row["workspace_mb"] = sum(_bytes(b) for b in casting.WORKSPACE._buffers().values()) / MB
    return row


def weight_casts_mb(net):
    """MB of the parameter casts in ``net``'s cached graph (None before it is built)."""
    graph = getattr(net, "_cached_graph", None)
    if not graph:
        return None
    nodes = json.loads(graph[1].tojson(remove_amp_cast=False))["nodes"]
    params = {p.name: p for p in net.collect_params().values()}
    total = 0
    for node in nodes:
        dtype = node.get("attrs", {}).get("dtype")
        if node["op"] != "amp_cast" or dtype not in ("float16", "bfloat16"):
            continue
        source = nodes[node["inputs"][0][0]]
        param = params.get(source["name"]) if source["op"] == "null" else None
        if param is not None and param.shape:
            total += int(np.prod(param.shape)) * 2   # both targets are 2 bytes wide
    return total / MB


def step_storage_mb(step):
    """MB by which MXNet's storage grows above its start while ``step`` runs once (None where
    MXNet wrote no trace)."""
    import mxnet as mx
    mx.nd.waitall()
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    mx.profiler.set_config(profile_memory=True, profile_symbolic=False, profile_imperative=False,
                           profile_api=False, filename=path)   # counters only: small
    mx.profiler.set_state("run")
    try:
        step()
        mx.nd.waitall()
    finally:
        mx.profiler.set_state("stop")
        mx.profiler.dump()   # MXNet finishes a trace once per process: call this last
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except ValueError:     # a process whose profiler ran before (amp.tune's) writes no trace
        return None
    finally:
        os.remove(path)
    counter = sorted((e for e in events if e.get("ph") == "C"
                      and e["name"].startswith("Memory: cpu")), key=lambda e: e["ts"])
    return max([e["args"][e["name"]] for e in counter] or [0]) / MB
