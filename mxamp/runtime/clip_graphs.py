"""ReLU6 after a BatchNorm (``clip(BatchNorm(x), 0, 6)``, every activation of MobileNet V2)
computed as MXNet's ``_maximum_scalar`` then ``_minimum_scalar`` where one of mxamp's casts
stands beside it (:func:`relu6_to_rewrite`), while a hybridized block builds its graph.

Why: MXNet 1.9.1's ``clip`` is a generic CPU kernel that takes a branch per element (above
``a_max``, below ``a_min``, or neither). A BatchNorm's outputs fall below 0 about half the time
in no order, so the branch is mispredicted about every other element. Forward on a plain
float32 8x96x56x56 array of such values (median ms, Zen 4, ``benchmark/bench_relu6.py``):
``clip`` 19.7, the pair (compiled without branches) 10.3 with one OpenMP thread; 10.7 and 5.9
with two. ``clip`` stays float32 under AMP (its bfloat16 kernel is 2.8x slower still:
``lists/bfloat16.py``), so this is the cost of MobileNet V2's step in both precisions: 138 of
235 ms under ``amp.init('bfloat16')`` with one thread, 78 of 222 with two
(``benchmark/profile_step.py survey_mobilenetv2_1_0 mxamp``). On values that rarely reach a
bound ``clip`` is the faster one (4.0 against 12.0 ms at mean 3 with one thread, 2.0 against
3.2 with two, as MobileNetV3's hard sigmoid ``clip(x + 3, 0, 6)`` sees them), so only a
BatchNorm's output is rewritten.

Why only beside mxamp's casts: MXNet's scalar ops write their input gradient in place over the
gradient that arrived, which keeps oneDNN's blocked layout (``aBcd8b`` from a 1x1
convolution's backward). A float32 BatchNorm reading that gradient directly, with its data in
``aBcd16b``, runs oneDNN's reference backward kernel (``bnorm_ref``): two inverted residual
units trained in 378-398 ms a step with the pair in float32 against 65-73 with ``clip`` (one
thread; 199-214 against 37-39 with two: ``bench_relu6.py``; MXNet's ``relu`` does the same).
Where one of mxamp's casts stands between the BatchNorm and the pair, or between the pair and
its readers, the gradient's layout comes from the cast and the BatchNorm stays on the jit
kernel: the same units under ``amp.init('bfloat16')`` took 39-47 ms against 59-82 with
``clip`` (one thread), 26-29 against 36-43 (two), and no ``bnorm_ref`` ran (native and
emulated, ``tests/test_clip_graphs.py``).

Values: the pair equals ``clip`` on every finite input, forward and backward; NaN stays NaN
forward. Only the sign of a zero can differ (``clip`` keeps -0.0, the pair gives +0.0; a
negative gradient masked off is -0.0). Where values are already NaN or infinite they differ:
at a NaN input the pair's gradient is 0 where ``clip`` passes it, and an infinite or NaN
gradient at a clipped element becomes NaN where ``clip`` writes 0 (such a step has overflowed
whatever the kernel, and the loss scaler skips it).
``tests/test_clip_graphs.py`` compares both with MXNet's own ``clip``.

>>> import mxnet as mx
>>> bn = mx.sym.BatchNorm(mx.sym.amp_cast(mx.sym.var('x'), dtype='float16'), name='bn')
>>> act = mx.sym.clip(mx.sym.amp_cast(bn, dtype='float32'), 0, 6, name='relu6')
>>> [n['op'] for n in json.loads(branch_free_relu6(act, {'x': 'float32'}).tojson(
...     remove_amp_cast=False))['nodes'] if n['op'] != 'null']
['amp_cast', 'BatchNorm', 'amp_cast', '_maximum_scalar', '_minimum_scalar']
"""
import json
import math

from mxamp.runtime.graph_edits import (consumers_of, data_dtypes, edit_block_graph, input_dtypes,
                                       with_nodes_around)

#: The treatment's name in a plan (``DevicePlan.clip_graphs``) and in its description.
BRANCH_FREE_RELU6 = "ReLU6 after BatchNorm computed without branches"
#: Where ``cast_model`` leaves its plan's treatment on the model (``amp.init``'s plan holds it too).
TREATMENT_ATTR = "_mxamp_clip_treatment"
#: The name of the ``_maximum_scalar`` put before each rewritten clip: the clip's and this.
FLOOR_SUFFIX = "_mxamp_floor"
_LOW = ("bfloat16", "float16")


def _has_finite_bounds(node):
    """True for a clip whose bounds are finite and ordered (not mxamp's own (-inf, inf) clip
    of ``depthwise_graphs``)."""
    attrs = node.get("attrs", {})
    try:
        low, high = float(attrs["a_min"]), float(attrs["a_max"])
    except (KeyError, ValueError):
        return False
    return math.isfinite(low) and math.isfinite(high) and low <= high


def _is_cast(node, to):
    return node["op"] == "amp_cast" and node.get("attrs", {}).get("dtype") in to


def _batchnorm_output(nodes, entry):
    return nodes[entry[0]]["op"] == "BatchNorm" and entry[1] == 0


def relu6_to_rewrite(graph, known_inputs):
    """Indices of the clips in ``graph`` (parsed JSON) that this module rewrites: finite,
    ordered bounds, and a BatchNorm's output with one of mxamp's casts beside, by MXNet's type
    inference given ``known_inputs`` (input name -> dtype): either the clip's data is a cast
    to float32 of a BatchNorm's bfloat16 or float16 output, or it is a BatchNorm's float32
    output and only casts to bfloat16 or float16 read the clip (a float32 BatchNorm among
    low-precision layers, as ``depthwise_graphs`` makes at grouped convolutions).

    >>> import mxnet as mx
    >>> act = mx.sym.clip(mx.sym.BatchNorm(mx.sym.var('x')), 0, 6)   # float32: no cast
    >>> relu6_to_rewrite(json.loads(act.tojson()), {'x': 'float32'})
    set()
    """
    nodes = graph["nodes"]
    consumers = consumers_of(nodes)
    wanted = {}     # clip index -> (node whose data dtype decides, the dtypes it must be)
    for i, node in enumerate(nodes):
        if node["op"] != "clip" or not _has_finite_bounds(node):
            continue
        data = node["inputs"][0]
        source = nodes[data[0]]
        if _is_cast(source, ("float32",)) and _batchnorm_output(nodes, source["inputs"][0]):
            wanted[i] = (data[0], _LOW)
        elif _batchnorm_output(nodes, data) and consumers.get(i) and \
                all(_is_cast(nodes[c], _LOW) for c in consumers[i]):
            wanted[i] = (i, ("float32",))
    if not wanted:
        return set()
    dtype_of = data_dtypes(graph, {at for at, _ in wanted.values()}, known_inputs)
    return {i for i, (at, allowed) in wanted.items() if dtype_of.get(at) in allowed}


def branch_free_relu6(sym, known_inputs):
    """``sym`` with each clip :func:`relu6_to_rewrite` finds computed as ``_maximum_scalar``
    (``a_min``) then ``_minimum_scalar`` (``a_max``, under the clip's name); ``sym`` itself
    where there is none."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    found = relu6_to_rewrite(graph, known_inputs)
    if not found:
        return sym
    floors = {}
    for i in found:
        node = graph["nodes"][i]
        floors[i] = node["attrs"]["a_min"]
        node.update(op="_minimum_scalar", attrs={"scalar": node["attrs"]["a_max"]})

    def before(i, node):
        return ("_maximum_scalar", node["name"] + FLOOR_SUFFIX, {"scalar": floors[i]}) \
            if i in floors else None
    return with_nodes_around(sym, graph=graph, before=before)


def build_clip_graph(block, args, treatment):
    """Give the graph ``block`` builds for ``args`` (after any other treatment of it)
    ``treatment``, before MXNet builds its cached op from it."""
    if treatment == BRANCH_FREE_RELU6:
        edit_block_graph(block, args, lambda out, inputs: branch_free_relu6(
            out, input_dtypes(inputs, args)))
