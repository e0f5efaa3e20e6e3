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
* :data:`FLOAT32_BATCHNORM_AT_GROUPS` (the ``native`` and ``emulated`` classes, hybridized
  graphs): each BatchNorm that feeds or is fed by a grouped convolution whose groups are off
  16-channel blocks (ResNeXt's 32x4d: 4 and 8 channels a group) computes in float32 between
  casts. oneDNN 2.4 lays such a convolution's data and gradient out in blocks of 4 or 8
  channels, which no jit BatchNorm takes, so BatchNorm falls to ``bnorm_ref``, in float32 as in
  bfloat16: 62% of a GluonCV ResNeXt-50 training step (112 px, Zen 4). A cast hands
  BatchNorm plain float32 data and gradients, which ``ncsp_bnorm`` computes: oneDNN's
  primitive time for the step went from 2617 to 430 ms. Groups off the blocks in their input
  channels count too (ShuffleNet V1: 3 groups of 20), and a BatchNorm that is float32 already
  gets a Reshape before it and a ``clip`` to (-inf, inf) after it instead, whose backward
  hands it a plain gradient: GluonCV ShuffleNet V1 trained at 0.95-0.99x float32, 3.5x now.

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
import ast
import json

import mxnet as mx

from mxamp.backend import mxnet_private as mxp
from mxamp.backend.graphs import data_shapes_of
from mxamp.runtime.graph_edits import (consumers_of, data_dtypes, graph_input_shapes,
                                       input_dtypes, layout_reshape, with_nodes_around)
from mxamp.runtime.state import STATE

#: A Reshape before each BatchNorm of the graph (see the module's docstring).
STEER_BATCHNORM = "steer BatchNorm"
#: The graph computes in float32 (AMP, the loss scaler and skipping on).
FLOAT32_GRAPH = "float32"
#: BatchNorm next to a grouped convolution off 16-channel blocks computes in float32.
FLOAT32_BATCHNORM_AT_GROUPS = "float32 BatchNorm at grouped convolutions"
#: The treatments that have a form for blocks run without ``hybridize()``.
IMPERATIVE_TREATMENTS = (STEER_BATCHNORM, FLOAT32_GRAPH)
#: Ops between a BatchNorm and the convolution it feeds that keep the data's layout.
_LAYOUT_KEEPING = ("Activation", "amp_cast", "relu", "LeakyReLU")
#: Where ``cast_model`` leaves its plan's treatment on the model (``amp.init``'s plan holds it too).
TREATMENT_ATTR = "_mxamp_depthwise_treatment"
#: The name each gradient-steering ``clip`` after a float32 BatchNorm gets.
GRADIENT_SUFFIX = "_mxamp_gradient_layout"


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
    return with_nodes_around(
        sym, before=lambda _, node: layout_reshape(node) if node["op"] == "BatchNorm" else None)


def _off_grid_groups(sym, nodes, known_shapes=None):
    """Indices of the grouped (not depthwise) convolutions whose groups are off 16-channel
    blocks, in their output channels or their input channels (the weight's declared shape, else
    MXNet's inference from ``known_shapes``; unknown counts as on the blocks)."""
    grouped = [i for i, node in enumerate(nodes) if node["op"] == "Convolution"
               and int(node.get("attrs", {}).get("num_group", 1)) > 1]
    inputs_per_group, unknown = {}, []
    for i in grouped:
        weight = nodes[nodes[i]["inputs"][1][0]] if len(nodes[i]["inputs"]) > 1 else {}
        declared = weight.get("attrs", {}).get("__shape__")
        per_group = ast.literal_eval(declared)[1] if declared else 0
        if per_group:
            inputs_per_group[i] = per_group
        else:
            unknown.append(i)
    if unknown and known_shapes:
        shapes = data_shapes_of(sym, [nodes[i] for i in unknown], known_shapes)
        for i in unknown:
            shape = shapes.get(nodes[i]["name"])
            if shape:
                inputs_per_group[i] = shape[1] // int(nodes[i]["attrs"]["num_group"])
    found = set()
    for i in grouped:
        attrs = nodes[i]["attrs"]
        groups = int(attrs["num_group"])
        per_group = (int(attrs["num_filter"]) // groups, inputs_per_group.get(i, 0))
        if any(n > 1 and n % 16 for n in per_group):
            found.add(i)
    return found


def _batchnorms_at(nodes, convolutions):
    """Indices of the BatchNorms whose data comes from one of ``convolutions``, or whose output
    reaches one through layout-keeping ops (its gradient then comes back in that layout)."""
    consumers = consumers_of(nodes)
    found = set()
    for i, node in enumerate(nodes):
        if node["op"] != "BatchNorm":
            continue
        producer = node["inputs"][0][0]
        while nodes[producer]["op"] == "amp_cast":
            producer = nodes[producer]["inputs"][0][0]
        frontier, reached = [i], {producer} & convolutions
        while frontier and not reached:
            for after in consumers.get(frontier.pop(), ()):
                if after in convolutions:
                    reached.add(after)
                elif nodes[after]["op"] in _LAYOUT_KEEPING:
                    frontier.append(after)
        if reached:
            found.add(i)
    return found


def float32_batchnorm_at_groups(sym, input_dtypes=None, low="bfloat16", input_shapes=None):
    """``sym`` with each BatchNorm next to a grouped convolution off 16-channel blocks computed
    in float32, in MXNet's plain layout: ``amp_cast`` to float32 before its data and back to
    ``low`` after its output where its data is ``low``; where it is float32 (the speed rules, or
    an override list, keep the layers around it in float32), a Reshape before its data and a
    ``clip`` to (-inf, inf) after its output, whose backward hands it a plain gradient. With
    ``input_dtypes`` (the dtype of each data input, by name), MXNet's type inference tells
    which; without, every one is taken as ``low``. ``input_shapes`` (by name) tell the input
    channels of the convolutions whose weights do not declare them yet.

    >>> x = mx.sym.var('data')
    >>> g = mx.sym.Convolution(x, kernel=(3, 3), num_filter=32, num_group=8, name='g')
    >>> out = mx.sym.Convolution(mx.sym.BatchNorm(g, name='bn'), kernel=(1, 1), num_filter=8)
    >>> graph = float32_batchnorm_at_groups(out).tojson(remove_amp_cast=False)
    >>> [n['name'] for n in json.loads(graph)['nodes'] if n['op'] in ('amp_cast', 'BatchNorm')]
    ['bn_float32', 'bn', 'bn_bfloat16']
    >>> graph = float32_batchnorm_at_groups(out, {'data': 'float32'}).tojson()
    >>> [n['name'] for n in json.loads(graph)['nodes']
    ...  if n['op'] in ('Reshape', 'BatchNorm', 'clip')]
    ['bn_mxamp_layout', 'bn', 'bn_mxamp_gradient_layout']
    """
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    treated = _batchnorms_at(graph["nodes"], _off_grid_groups(sym, graph["nodes"], input_shapes))
    found = {i: low for i in treated}
    if treated and input_dtypes is not None:
        found = data_dtypes(graph, treated, input_dtypes)
    cast = {i for i in treated if found.get(i) == low}
    reshape = {i for i in treated if found.get(i) == "float32"}
    if not cast and not reshape:
        return sym

    def before(i, node):
        if i in reshape:
            return layout_reshape(node)
        return ("amp_cast", node["name"] + "_float32", {"dtype": "float32"}) if i in cast else None
    def after(i, node):
        if i in reshape:    # an exact identity, inf and NaN too; its backward writes plain
            return "clip", node["name"] + GRADIENT_SUFFIX, {"a_min": "-inf", "a_max": "inf"}
        return ("amp_cast", node["name"] + "_" + low, {"dtype": low}) if i in cast else None
    return with_nodes_around(sym, before=before, after=after, graph=graph)


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
    elif treatment == FLOAT32_BATCHNORM_AT_GROUPS:
        view.cached_graph = (inputs, float32_batchnorm_at_groups(
            out, input_dtypes(inputs, args), input_shapes=graph_input_shapes(args)))
    elif treatment == FLOAT32_GRAPH:
        view.cached_graph = ()
        with STATE.disabled_region():
            view.trace(*args)
