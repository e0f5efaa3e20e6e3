"""Global average pooling whose output feeds a convolution, as in squeeze-excitation gates
(MobileNetV3's SE blocks: pool, 1x1 convolution, activation, 1x1 convolution, scale), and
adaptive average pooling to one pixel: steered off slow kernels while a hybridized block
builds its graph.

Why: MXNet 1.9.1 asks oneDNN 2.4 for a pooling's input gradient in any layout, and oneDNN
copies the order of the output gradient's strides. That gradient is 1x1 pixels: its channel
and spatial strides tie, and oneDNN breaks the tie by the input's sizes, largest outermost
(``simultaneous_sort`` in ``memory_desc_init_by_blocking_desc``). Where the channels are
fewer than the pixels of a row or column, the gradient is laid out channels-last (``acdb``,
``acdB16b``, ``cdaB16b``), which no jit pooling kernel takes: backward pooling runs oneDNN's
reference kernel, and often the BatchNorm before it gets that layout and runs ``bnorm_ref``.
That holds in float32 as in bfloat16, on every class measured (AVX2, AVX-512, AVX512-BF16).
Where the pooling's input is blocked, its output gradient is too, and the channels count in
blocks of 16, so even 64 channels at 28x28 fall to it.

Two steerings, by the pooling's input shape (known while a graph is built):

* **Reshape** before the pooling, where its channels are at least each spatial size (MXNet's
  Reshape hands it a plain input, its gradient comes back plain and the tie goes to ``abcd``):
  one SE unit (8x64x28x28, Zen 4) trained in 44 ms a step as is, 16.4 ms with the Reshape.
* **mean** over the spatial axes, in float32 (casts around it where the data is bfloat16 or
  float16, as oneDNN's pooling accumulates in float32), elsewhere and where the shape is
  unknown: ``mean`` is not a oneDNN operator, and its backward writes a plain gradient. The
  same unit at 16 channels: 11 ms (float32) and 25 ms (bfloat16 requested) as is, 4.1-4.4 ms
  as ``mean``; at 64 channels ``mean`` took 16.8-18.9 ms, the Reshape 14.6-16.4.

MXNet's ``contrib.AdaptiveAvgPooling2D`` to one pixel (GluonCV's SE-ResNet gates, into Dense
layers) is a global average on a generic MXNet kernel: 89 of a 464 ms SE-ResNet-18 training
step (mx.profiler, forward and backward, Zen 4). It gets the same steering, whatever reads it,
as oneDNN's Pooling or as ``mean``: SE-ResNet-18 went from 1.06x float32 to 1.50x.

All of these change layouts and kernels, not values (``tests/test_pooling_graphs.py``
compares them).

>>> import mxnet as mx
>>> x = mx.sym.var('data')
>>> gate = mx.sym.Pooling(x, global_pool=True, pool_type='avg', kernel=(1, 1), name='pool')
>>> out = mx.sym.broadcast_mul(x, mx.sym.Convolution(gate, kernel=(1, 1), num_filter=8))
>>> [(n['op'], n['name']) for n in json.loads(steer_global_pooling(out).tojson())['nodes']
...  if n['op'] in ('mean', 'Pooling', 'Reshape')]
[('mean', 'pool')]
>>> steered = steer_global_pooling(out, known_shapes={'data': (2, 8, 4, 4)})
>>> [(n['op'], n['name']) for n in json.loads(steered.tojson())['nodes']
...  if n['op'] in ('mean', 'Pooling', 'Reshape')]
[('Reshape', 'pool_mxamp_layout'), ('Pooling', 'pool')]
"""
import ast
import json

from mxamp.backend.graphs import data_shapes_of
from mxamp.runtime.graph_edits import (consumers_of, data_dtypes, edit_block_graph,
                                       graph_input_shapes, input_dtypes, layout_reshape,
                                       with_nodes_around)

#: Global average pooling into convolutions steered (see the module's docstring).
STEER_POOLING = "global average pooling into convolutions steered off reference kernels"
#: Where ``cast_model`` leaves its plan's treatment on the model (``amp.init``'s plan holds it too).
TREATMENT_ATTR = "_mxamp_pooling_treatment"
#: Ops between the pooling and the convolution through which the gradient keeps its layout.
_PASSING = ("amp_cast", "amp_multicast", "Activation", "relu", "Flatten", "Reshape")
_LOW = ("bfloat16", "float16")


def _is_global_average(node):
    attrs = node.get("attrs", {})
    return (node["op"] == "Pooling" and attrs.get("global_pool") in ("True", "true", "1")
            and attrs.get("pool_type", "max") == "avg"
            and attrs.get("layout", "None") in ("None", "NCW", "NCHW", "NCDHW"))


def _is_adaptive_global(node):
    """MXNet's ``contrib.AdaptiveAvgPooling2D`` to one pixel (its default): a global average
    written as a generic, unvectorised MXNet kernel (SE-ResNet's gates in GluonCV)."""
    if node["op"] != "_contrib_AdaptiveAvgPooling2D":
        return False
    size = ast.literal_eval(node.get("attrs", {}).get("output_size", "1"))
    return all(n == 1 for n in (size if isinstance(size, (tuple, list)) else (size,)))


def poolings_to_steer(nodes):
    """Indices of the poolings this module steers: the global average poolings
    (channels-first) whose output reaches a Convolution directly or through casts and
    activations, and every adaptive average pooling to one pixel (whatever reads it).

    >>> import mxnet as mx
    >>> p = mx.sym.Pooling(mx.sym.var('x'), global_pool=True, pool_type='avg', kernel=(1, 1))
    >>> nodes = json.loads(mx.sym.FullyConnected(p, num_hidden=2).tojson())['nodes']
    >>> poolings_to_steer(nodes)
    set()
    """
    consumers = consumers_of(nodes)
    found = {i for i, node in enumerate(nodes) if _is_adaptive_global(node)}
    for i, node in enumerate(nodes):
        if not _is_global_average(node):
            continue
        frontier, seen = [i], set()
        while frontier:
            for reader in consumers.get(frontier.pop(), ()):
                if nodes[reader]["op"] == "Convolution":
                    found.add(i)
                elif nodes[reader]["op"] in _PASSING and reader not in seen:
                    seen.add(reader)
                    frontier.append(reader)
    return found


def _reshape_suffices(shape):
    """True when a Reshape before a pooling of input ``shape`` steers its gradient plain:
    channels at least each spatial size (oneDNN's tie-break, see the module's docstring)."""
    return shape is not None and len(shape) > 2 and all(shape[1] >= size for size in shape[2:])


def steer_global_pooling(sym, known_inputs=None, known_shapes=None):
    """``sym`` with each global average pooling into a convolution steered: a Reshape before
    it where ``known_shapes`` (input name -> shape) give its input's channels at least each
    spatial size, else computed as ``mean`` in float32. With ``known_inputs`` (the dtype of each
    data input, by name), a ``mean`` whose data MXNet infers as bfloat16 or float16 gets casts
    to float32 and back, and one whose dtype it cannot infer stays a pooling; without, every
    one is taken as float32. ``sym`` itself where there is none."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    found = poolings_to_steer(graph["nodes"])
    shapes = data_shapes_of(sym, [graph["nodes"][i] for i in found], known_shapes) \
        if found and known_shapes else {}
    reshaped = {i for i in found if _reshape_suffices(shapes.get(graph["nodes"][i]["name"]))}
    means = found - reshaped
    dtype_of = data_dtypes(graph, means, known_inputs) if means and known_inputs is not None \
        else {i: "float32" for i in means}
    means = {i for i in means if dtype_of.get(i) in ("float32",) + _LOW}
    if not reshaped and not means:
        return sym
    for i in means:
        node = graph["nodes"][i]
        spatial = len(ast.literal_eval(node.get("attrs", {}).get("kernel", "(1, 1)")))
        node.update(op="mean", attrs={"axis": str(tuple(range(2, 2 + spatial))),
                                      "keepdims": "True"})
    for i in reshaped:
        if _is_adaptive_global(graph["nodes"][i]):    # the same average, on oneDNN's kernel
            graph["nodes"][i].update(op="Pooling", attrs={
                "global_pool": "True", "pool_type": "avg", "kernel": "(1, 1)"})
    low = {i for i in means if dtype_of[i] in _LOW}

    def before(i, node):
        if i in reshaped:
            return layout_reshape(node)
        return ("amp_cast", node["name"] + "_float32", {"dtype": "float32"}) if i in low else None

    def after(i, node):
        return ("amp_cast", node["name"] + "_" + dtype_of[i], {"dtype": dtype_of[i]}) \
            if i in low else None
    return with_nodes_around(sym, graph=graph, before=before, after=after)


def build_pooling_graph(block, args, treatment):
    """Give the graph ``block`` builds for ``args`` (after any other treatment of it)
    ``treatment``, before MXNet builds its cached op from it."""
    if treatment == STEER_POOLING:
        edit_block_graph(block, args, lambda out, inputs: steer_global_pooling(
            out, input_dtypes(inputs, args), graph_input_shapes(args)))
