"""Read-only views of a Symbol's graph: its nodes, casts, dtypes and shapes.

The one place mxamp reads a graph; nothing here changes one. Shapes come from MXNet's own
partial inference, so a shape MXNet cannot infer is None ("unknown"), never a guess.

>>> import mxnet as mx
>>> sorted(op_names(mx.sym.relu(mx.sym.var('x')) + 1))
['_plus_scalar', 'relu']
"""
import json

from mxamp import dtypes

#: Ops MXNet's precision pass inserts; they belong to no op list.
CAST_OPS = ("amp_cast", "amp_multicast")


def graph_nodes(sym):
    """A Symbol's graph nodes (dicts: ``op``, ``name``, ``inputs``, ``attrs``), casts kept.

    ``Symbol.tojson()`` drops ``amp_cast`` nodes unless told otherwise; this never does.

    >>> import mxnet as mx
    >>> [n['name'] for n in graph_nodes(mx.sym.relu(mx.sym.var('x'), name='r'))]
    ['x', 'r']
    """
    return json.loads(sym.tojson(remove_amp_cast=False))["nodes"]


def cast_nodes(sym):
    """The ``amp_cast`` / ``amp_multicast`` nodes, each with ``sources``: the names it reads.

    >>> import mxnet as mx
    >>> cast_nodes(mx.sym.var('x'))
    []
    """
    nodes = graph_nodes(sym)
    out = []
    for node in nodes:
        if node["op"] in CAST_OPS:
            entry = dict(node)
            entry["sources"] = [nodes[i[0]]["name"] for i in node["inputs"]]
            out.append(entry)
    return out


def op_names(sym):
    """The set of operator names the graph uses (variables and AMP casts left out).

    >>> import mxnet as mx
    >>> sorted(op_names(mx.sym.relu(mx.sym.var('x')) + 1))
    ['_plus_scalar', 'relu']
    """
    return {n["op"] for n in graph_nodes(sym) if n["op"] != "null" and n["op"] not in CAST_OPS}


def param_dtypes(sym):
    """Graph input name -> canonical dtype name, from the ``__dtype__`` attributes the pass set.

    Inputs without the attribute (data) are left out.

    >>> import mxnet as mx
    >>> param_dtypes(mx.sym.var('w', dtype='float16'))
    {'w': 'float16'}
    """
    attrs = sym.attr_dict()
    out = {}
    for name in sym.list_inputs():
        flag = attrs.get(name, {}).get("__dtype__")
        if flag in dtypes.FLAG_NAMES:
            out[name] = dtypes.FLAG_NAMES[flag]
    return out


def output_dtypes(sym, **input_dtypes):
    """Each node output name -> dtype name, by MXNet's type inference on the whole graph.

    ``input_dtypes`` gives the dtype of data inputs (default float32); parameters use the
    ``__dtype__`` the pass recorded. Outputs whose type cannot be inferred are left out.

    >>> import mxnet as mx
    >>> s = mx.sym.amp_cast(mx.sym.var('x'), dtype='float16', name='c')
    >>> output_dtypes(s)['c_output']
    'float16'
    """
    internals = sym.get_internals()
    known = dict(param_dtypes(sym))
    for name in sym.list_inputs():
        known.setdefault(name, "float32")
    known.update({k: dtypes.name_of(v) for k, v in input_dtypes.items()})
    _, out_types, _ = internals.infer_type_partial(
        **{k: dtypes.to_mx(v) for k, v in known.items()})
    if out_types is None:
        return {}
    return {name: dtypes.name_of(t) for name, t in zip(internals.list_outputs(), out_types)
            if t is not None}


def _node_data_shape(internals, outputs, node_name, known_shapes):
    """The shape of the first input of node ``node_name`` (``outputs`` are ``internals``'
    output names), inferred from ``known_shapes`` as far as MXNet can; None if unknown.

    """
    # the node's first output: '<name>_output' (or '_output0'...), never a parameter of it
    # ('<name>_weight' is a variable: it has no children)
    mine = [o for o in outputs if o.startswith(node_name + "_output")]
    if not mine:
        return None
    children = internals[mine[0]].get_children()
    if children is None:
        return None
    return symbol_data_shape(children[0], known_shapes)


def symbol_data_shape(sym, known=None):
    """The output shape of ``sym`` as far as MXNet can infer it, or None.

    Shapes come from the parameters' declared shapes and from ``known`` (input name -> shape;
    while a hybridized block builds its graph, :func:`mxamp.runtime.hooks.building_input_shapes`).

    >>> import mxnet as mx
    >>> symbol_data_shape(mx.sym.var('x', shape=(2, 3)) * 2)
    (2, 3)
    """
    known = known or {}
    try:
        if known:
            names = set(sym.list_arguments())
            known = {k: v for k, v in known.items() if k in names}
        _, out, _ = sym.infer_shape_partial(**known)
    except Exception:  # noqa: BLE001 - an uninferable graph only means "shape unknown"
        return None
    if not out or not out[0] or not all(out[0]):
        return None
    return tuple(out[0])


def data_shapes_of(sym, nodes, known_shapes):
    """``{node name: shape of its first input, or None}`` for ``nodes`` (dicts from
    :func:`graph_nodes`) of ``sym``: the one graph scan with shapes. Each node's input is
    inferred alone, so the rest of the graph need not infer.

    >>> import mxnet as mx
    >>> conv = mx.sym.Convolution(mx.sym.var('data'), kernel=(3, 3), num_filter=4, name='c')
    >>> data_shapes_of(conv, graph_nodes(conv)[-1:], {'data': (1, 3, 8, 8)})
    {'c': (1, 3, 8, 8)}
    """
    if not nodes:
        return {}
    internals = sym.get_internals()
    outputs = internals.list_outputs()
    return {n["name"]: _node_data_shape(internals, outputs, n["name"], known_shapes)
            for n in nodes}
