"""The treatments of whole graphs with depthwise convolutions: what a
:class:`~mxamp.precision.device_plan.DevicePlan` asks for them (``depthwise_graphs``), applied
while a hybridized block builds its graph (:func:`build_depthwise_graph`), and to each call of a
block that runs without ``hybridize()`` (``mxamp.runtime.hooks.hook_imperative_depthwise``).

* :data:`STEER_BATCHNORM` (the ``amx`` class): a Reshape before each BatchNorm. With AMX,
  oneDNN 2.4 lays regular convolutions out as nhwc and depthwise ones as nChw16c, so a BatchNorm
  between the two gets its input in one layout and its gradient in the other, and its backward
  falls to the reference kernel (``bnorm_ref``); only the jit kernel's condition
  ``src_tag == diff_src_tag`` stands between (NOTES.md 2c). MXNet's Reshape operator hands
  BatchNorm a plain layout, which MXNet then reorders to match: MobileNet 1.0 training on an
  AMX Xeon went from 2761 to 305 ms a step (float32: 156 ms; 4 threads, 2026-11-26). Without
  ``hybridize()`` the same Reshape runs before each BatchNorm layer: 2860 to 303-340 ms
  (float32: 181-198 ms; ``benchmark/results/xeon-amx-h100-host/head-a275461/``).
* :data:`FLOAT32_GRAPH` (``'auto'`` where the probe's depthwise block measured bfloat16 slower):
  the graph is traced with AMP's casts off, so it computes in float32; the loss scaler still
  runs.

A graph without depthwise convolutions (``Convolution`` with ``num_group > 1``) is left as is.

>>> import mxnet as mx
>>> x = mx.sym.var('data')
>>> y = mx.sym.Convolution(x, kernel=(3, 3), num_filter=8, num_group=8, name='dw')
>>> has_depthwise_convolution(mx.sym.BatchNorm(y, name='bn'))
True
>>> [n['op'] for n in json.loads(steer_batchnorm(mx.sym.BatchNorm(y, name='bn')).tojson())
...  ['nodes'] if n['op'] != 'null']
['Convolution', 'Reshape', 'BatchNorm']
"""
import json

import mxnet as mx

from mxamp.backend import mxnet_private as mxp
from mxamp.runtime.state import STATE

#: A Reshape before each BatchNorm of the graph (see the module's docstring).
STEER_BATCHNORM = "steer BatchNorm"
#: The graph computes in float32 (AMP, the loss scaler and skipping on).
FLOAT32_GRAPH = "float32"
#: Where ``cast_model`` leaves its plan's treatment on the model (``amp.init``'s plan holds it too).
TREATMENT_ATTR = "_mxamp_depthwise_treatment"
#: The name each steering Reshape gets: the BatchNorm's name and this suffix.
STEER_SUFFIX = "_mxamp_layout"


def has_depthwise_convolution(sym):
    """True when ``sym`` has a ``Convolution`` with more than one group."""
    return any(node["op"] == "Convolution" and int(node.get("attrs", {}).get("num_group", 1)) > 1
               for node in json.loads(sym.tojson(remove_amp_cast=False))["nodes"])


def has_depthwise_layer(block):
    """True when ``block`` or a block under it is a Gluon convolution with more than one group.

    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential(); net.add(nn.Conv2D(8, 3, groups=8, in_channels=8))
    >>> has_depthwise_layer(net), has_depthwise_layer(nn.Conv2D(8, 3, in_channels=8))
    (True, False)
    """
    return mxp.convolution_groups(block) > 1 or any(
        has_depthwise_layer(child) for child in mxp.BlockView(block).children.values())


def steered_input(data):
    """``data`` through MXNet's Reshape to its own shape, as the graph steering does: what a
    BatchNorm layer gets instead of ``data`` when it runs without ``hybridize()``.

    >>> steered_input(mx.nd.ones((1, 2, 2, 2))).shape
    (1, 2, 2, 2)
    """
    if isinstance(data, mx.np.ndarray):
        return mx.nd.reshape(data.as_nd_ndarray(), shape=(-2,)).as_np_ndarray()
    return mx.nd.reshape(data, shape=(-2,))


def steer_batchnorm(sym):
    """``sym`` with a Reshape to the same shape (``shape=(-2,)``) before each BatchNorm's data."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    nodes, new_id = [], {}

    def entry(e):
        return [new_id[e[0]]] + list(e[1:])

    for old_id, node in enumerate(graph["nodes"]):
        node = dict(node, inputs=[entry(e) for e in node["inputs"]])
        if node["op"] == "BatchNorm":
            nodes.append({"op": "Reshape", "name": node["name"] + STEER_SUFFIX,
                          "attrs": {"shape": "(-2,)"}, "inputs": [node["inputs"][0]]})
            node["inputs"][0] = [len(nodes) - 1, 0, 0]
        new_id[old_id] = len(nodes)
        nodes.append(node)
    graph["nodes"] = nodes
    graph["arg_nodes"] = [i for i, n in enumerate(nodes) if n["op"] == "null"]
    graph["heads"] = [entry(h) for h in graph["heads"]]
    graph.pop("node_row_ptr", None)
    steered = mx.sym.load_json(json.dumps(graph))
    return steered.as_np_ndarray() if isinstance(sym, mxp.NumpySymbol) else steered


def build_depthwise_graph(block, args, treatment):
    """Trace ``block``'s graph for ``args`` as ``treatment`` says, before MXNet builds its cached
    op from it; a graph without depthwise convolutions is traced as usual."""
    if not treatment:
        return
    view = mxp.BlockView(block)
    inputs, out = view.trace(*args)   # MXNet's build reuses this trace
    if not has_depthwise_convolution(out):
        return
    if treatment == STEER_BATCHNORM:
        view.cached_graph = (inputs, steer_batchnorm(out))
    elif treatment == FLOAT32_GRAPH:
        view.cached_graph = ()
        with STATE.disabled_region():
            view.trace(*args)
