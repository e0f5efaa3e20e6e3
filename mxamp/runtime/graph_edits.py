"""Edits of a Symbol's graph JSON that the graph treatments share: a node inserted before or
after others (:func:`with_nodes_around`), who reads each node (:func:`consumers_of`), and the
dtype of a node's data (:func:`data_dtypes`, given the block's :func:`input_dtypes`), the
block's input shapes under Gluon's names (:func:`graph_input_shapes`), the steering Reshape
the treatments put before a node (:func:`layout_reshape`), and an edit given to the graph a
block is building (:func:`edit_block_graph`).

The treatments (:mod:`mxamp.runtime.depthwise_graphs`, :mod:`mxamp.runtime.pooling_graphs`,
:mod:`mxamp.runtime.clip_graphs`) decide where; this module only edits. An edited graph is
loaded back with MXNet's own ``load_json``, so MXNet checks it like any other.

>>> import mxnet as mx
>>> y = mx.sym.relu(mx.sym.var('x'), name='r')
>>> edited = with_nodes_around(y, before=lambda i, n: ('Reshape', 'r_in', {'shape': '(-2,)'})
...                            if n['op'] == 'relu' else None)
>>> [n['op'] for n in json.loads(edited.tojson())['nodes']]
['null', 'Reshape', 'relu']
"""
import json

import mxnet as mx

from mxamp import dtypes
from mxamp.backend import mxnet_private as mxp


#: The name each steering Reshape gets: the steered node's name and this suffix.
STEER_SUFFIX = "_mxamp_layout"


def layout_reshape(node):
    """The node spec (:func:`with_nodes_around`) of a Reshape to its input's own shape before
    ``node``: MXNet's Reshape hands ``node`` its data in MXNet's plain layout.

    >>> layout_reshape({'name': 'bn'})
    ('Reshape', 'bn_mxamp_layout', {'shape': '(-2,)'})
    """
    return "Reshape", node["name"] + STEER_SUFFIX, {"shape": "(-2,)"}


def consumers_of(nodes):
    """{node index: indices of the nodes that read one of its outputs}, in graph order.

    >>> x = mx.sym.var('x'); y = mx.sym.relu(x) + mx.sym.sigmoid(x)
    >>> consumers_of(json.loads(y.tojson())['nodes'])[0]
    [1, 2]
    """
    found = {}
    for i, node in enumerate(nodes):
        for source in node["inputs"]:
            found.setdefault(source[0], []).append(i)
    return found


def with_nodes_around(sym, before=None, after=None, graph=None):
    """``sym`` with a node inserted before the data input of each node ``before(index, node)``
    names one for, and after the first output of each node ``after(index, node)`` names one
    for (``(op, name, attrs)``, or None); that output's consumers then read the new node.
    ``graph`` is ``sym``'s parsed JSON where the caller has it already. A numpy-mode Symbol
    comes back in numpy mode."""
    graph = graph or json.loads(sym.tojson(remove_amp_cast=False))
    nodes, new_id, read_after = [], {}, {}

    def entry(e):
        if e[0] in read_after and e[1] == 0:
            return [read_after[e[0]], 0, 0]
        return [new_id[e[0]]] + list(e[1:])

    def added(spec, source):
        op, name, attrs = spec
        nodes.append({"op": op, "name": name, "attrs": attrs, "inputs": [source]})
        return len(nodes) - 1

    for old_id, node in enumerate(graph["nodes"]):
        node = dict(node, inputs=[entry(e) for e in node["inputs"]])
        spec = before(old_id, node) if before else None
        if spec:
            node["inputs"][0] = [added(spec, node["inputs"][0]), 0, 0]
        new_id[old_id] = len(nodes)
        nodes.append(node)
        spec = after(old_id, node) if after else None
        if spec:
            read_after[old_id] = added(spec, [new_id[old_id], 0, 0])
    return symbol_of(graph, nodes, [entry(h) for h in graph["heads"]], sym)


def symbol_of(graph, nodes, heads, like):
    """The Symbol of an edited ``graph`` (parsed JSON) with ``nodes`` and ``heads``, loaded by
    MXNet's own ``load_json``, in ``like``'s interface (legacy or numpy).

    >>> x = mx.sym.var('x'); graph = json.loads(mx.sym.relu(x).tojson())
    >>> symbol_of(graph, graph['nodes'][:1], [[0, 0, 0]], x).name
    'x'
    """
    edited = dict(graph, nodes=nodes, heads=heads,
                  arg_nodes=[i for i, n in enumerate(nodes) if n["op"] == "null"])
    edited.pop("node_row_ptr", None)
    rebuilt = mx.sym.load_json(json.dumps(edited))
    return rebuilt.as_np_ndarray() if isinstance(like, mxp.NumpySymbol) else rebuilt


def edit_block_graph(block, args, edit):
    """Give the graph ``block`` builds for ``args`` (the graph another treatment left, or a
    fresh trace) the edit ``edit(sym, inputs)`` returns, before MXNet builds its cached op from
    it; an edit that returns ``sym`` itself leaves the graph as it is."""
    view = mxp.BlockView(block)
    inputs, out = view.trace(*args)
    edited = edit(out, inputs)
    if edited is not out:
        view.cached_graph = (inputs, edited)


def input_dtypes(inputs, args):
    """{input variable name: dtype} of a block's traced ``inputs`` called with ``args``
    (NDArray arguments only; Gluon flattens nested ones in the same order).

    >>> input_dtypes([mx.sym.var('data0')], (mx.nd.ones((1,), dtype='float16'),))
    {'data0': <class 'numpy.float16'>}
    """
    return {i.name: a.dtype for i, a in zip(inputs, mxp.flat_block_inputs(args))
            if isinstance(a, mx.nd.NDArray)}


def graph_input_shapes(args):
    """{'data': shape} or {'data0': ..., 'data1': ...}: Gluon's names for a block's array inputs.

    >>> graph_input_shapes((mx.nd.ones((2, 3)),))
    {'data': (2, 3)}
    """
    shapes = [getattr(a, "shape", None) for a in mxp.flat_block_inputs(args)]
    if len(shapes) == 1:
        return {"data": shapes[0]} if shapes[0] else {}
    return {"data%d" % i: s for i, s in enumerate(shapes) if s}


def data_dtypes(graph, indices, known_inputs):
    """{index: dtype name, or None} of the data (first input) of each node in ``indices``, by
    MXNet's type inference given ``known_inputs`` (:func:`input_dtypes`) for the graph's data
    inputs; {} if the inference fails.

    >>> y = mx.sym.relu(mx.sym.amp_cast(mx.sym.var('x'), dtype='float16'))
    >>> data_dtypes(json.loads(y.tojson(remove_amp_cast=False)), [2], {'x': 'float32'})
    {2: 'float16'}
    """
    nodes = []
    for node in graph["nodes"]:    # dtypes as variable attributes: infer_type drops bfloat16
        name = dtypes.name_of(known_inputs[node["name"]]) \
            if node["op"] == "null" and node["name"] in known_inputs else None
        if name in dtypes.TYPE_FLAGS:
            node = dict(node, attrs=dict(node.get("attrs", {}),
                                         __dtype__=str(dtypes.TYPE_FLAGS[name])))
        nodes.append(node)
    heads = [graph["nodes"][i]["inputs"][0] for i in sorted(indices)]
    probe = dict(graph, nodes=nodes, heads=heads)
    probe.pop("node_row_ptr", None)
    try:
        _, types, _ = mx.sym.load_json(json.dumps(probe)).infer_type_partial()
    except mx.base.MXNetError:
        return {}
    return {i: dtypes.name_of(t) if t is not None else None
            for i, t in zip(sorted(indices), types or ())}
