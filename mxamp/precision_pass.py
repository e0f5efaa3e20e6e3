"""MXNet's graph pass that inserts precision casts, and read-only views of a Symbol's graph.

The pass itself is C++ (``ReducePrecision`` in libmxnet, reached through the C function
``MXReducePrecisionSymbol``). It walks the graph once in topological order and, per node:

* low-precision op: casts its float inputs to the target (inputs that the op's own type
  inference wants in float32, such as BatchNorm's statistics, are left alone);
* float32 op, or a node named in ``excluded``: casts low-precision inputs back to float32;
* widest op: one ``amp_multicast`` over all inputs (or plain casts when every input's dtype is
  already known);
* any other op: runs in the dtype its first input has.

Casts are memoized per tensor (a weight feeding three ops is cast once) and every graph output
is cast back to float32. This module only marshals arguments; which op goes in which list is
decided by :mod:`mxamp.convert` from :mod:`mxamp.lists`.

>>> import mxnet as mx
>>> x = mx.sym.var('data')
>>> y = mx.sym.FullyConnected(x, num_hidden=4, name='fc')
>>> z = reduce_precision(y, 'bfloat16', low_precision=['FullyConnected'], fp32=[],
...                      widest=[], data_names=['data'])
>>> cast_nodes(z)[0]['name']
'data_amp_cast_bfloat16'
"""
import ctypes
import json
from array import array

from mxnet.symbol import Symbol

from . import dtypes
from .gluon_graph import symbol_data_shape
from .mxnet_private import LIB, SymbolHandle, c_array_buf, c_str_array, check_call, mx_uint

#: Ops the pass itself inserts; they belong to no op list.
CAST_OPS = ("amp_cast", "amp_multicast")


def reduce_precision(sym, target, low_precision, fp32, widest, conditional_fp32=None,
                     excluded=(), data_names=(), cast_params=False):
    """Run MXNet's ``ReducePrecision`` pass; return the new Symbol.

    ``conditional_fp32`` maps op -> (parameter, values). ``data_names`` are the graph inputs
    that carry data (typed float32); the other inputs are parameters, and the pass records the
    dtype each of them needs in its ``__dtype__`` attribute. ``cast_params=True`` lets the
    pass type parameters in the target dtype instead of inserting a cast after them.

    >>> import mxnet as mx
    >>> s = mx.sym.Activation(mx.sym.var('x'), act_type='relu')
    >>> [n['op'] for n in graph_nodes(reduce_precision(s, 'float16', [], [], [], data_names=['x']))]
    ['null', 'Activation', 'amp_cast']
    """
    conditional = sorted((conditional_fp32 or {}).items())
    cond_ops = [op for op, _ in conditional]
    cond_params = [param for _, (param, _) in conditional]
    cond_values, indptr = [], [0]
    for _, (_, values) in conditional:
        cond_values.extend(str(v) for v in values)
        indptr.append(len(cond_values))
    data_names = list(data_names)
    param_names = sorted(set(sym.list_inputs()) - set(data_names))
    low_precision, fp32, widest, excluded = (sorted(v) for v in (low_precision, fp32, widest,
                                                                 excluded))
    out = SymbolHandle()
    check_call(LIB.MXReducePrecisionSymbol(
        sym.handle, ctypes.byref(out),
        mx_uint(len(data_names)),
        c_array_buf(ctypes.c_int, array("i", [dtypes.TYPE_FLAGS["float32"]] * len(data_names))),
        mx_uint(len(indptr)), c_array_buf(ctypes.c_int, array("i", indptr)),
        ctypes.byref(ctypes.c_int(dtypes.TYPE_FLAGS[target])), ctypes.c_int(int(cast_params)),
        mx_uint(len(low_precision)), mx_uint(len(fp32)), mx_uint(len(widest)),
        mx_uint(len(cond_ops)), mx_uint(len(excluded)), mx_uint(len(param_names)),
        c_str_array(low_precision), c_str_array(fp32), c_str_array(widest),
        c_str_array(cond_ops), c_str_array(excluded), c_str_array(cond_params),
        c_str_array(cond_values), c_str_array(param_names), c_str_array(data_names)))
    return Symbol(out)


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


def node_data_shape(internals, outputs, node_name, known_shapes):
    """The shape of the first input of node ``node_name`` (``outputs`` are ``internals``'
    output names), inferred from ``known_shapes`` as far as MXNet can; None if unknown.

    >>> import mxnet as mx
    >>> conv = mx.sym.Convolution(mx.sym.var('data'), kernel=(3, 3), num_filter=4, name='c')
    >>> inner = conv.get_internals()
    >>> node_data_shape(inner, inner.list_outputs(), 'c', {'data': (1, 3, 8, 8)})
    (1, 3, 8, 8)
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


def conditional_fp32_nodes(sym, lists, known_shapes=None):
    """Names of the nodes of ``sym`` whose float32 condition holds: a conditional rule of the
    lists (``conditional_fp32_ops``) or a condition of the CPU class the graph is built for.

    ``known_shapes`` maps input names to shapes; a condition on a shape that cannot be inferred
    counts as its ``if_unknown``.

    >>> import mxnet as mx
    >>> from mxamp.opfuncs import lists_for
    >>> lists = lists_for('bfloat16', conditional_fp32_ops=[('Convolution', 'kernel', ['(7, 7)'])])
    >>> x = mx.sym.var('data')
    >>> stem = mx.sym.Convolution(x, kernel=(7, 7), num_filter=8, name='stem')
    >>> sorted(conditional_fp32_nodes(mx.sym.Convolution(stem, kernel=(3, 3), num_filter=8), lists))
    ['stem']
    """
    rules = {op: lists.conditions(op) for op in lists.conditional_fp32}
    for op, conds in lists.device_conditions.items():
        rules[op] = tuple(rules.get(op, ())) + tuple(conds)
    candidates = [n for n in graph_nodes(sym) if rules.get(n["op"])]
    if not candidates:
        return set()
    internals = sym.get_internals()
    outputs = internals.list_outputs()
    found = set()
    for node in candidates:
        attrs = node.get("attrs", {})
        conds = rules[node["op"]]
        shape = None
        if any(c.needs_shapes() for c in conds):
            shape = node_data_shape(internals, outputs, node["name"], known_shapes or {})
        if any(c.holds(attrs, shape) for c in conds):
            found.add(node["name"])
    return found
