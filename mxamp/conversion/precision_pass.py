"""MXNet's graph pass that inserts precision casts, and what is handed to it: the nodes a float32
condition keeps, the shared weights kept float32, the checked excluded names.

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
decided by :mod:`mxamp.conversion.convert` from :mod:`mxamp.lists`.

>>> import mxnet as mx
>>> x = mx.sym.var('data')
>>> y = mx.sym.FullyConnected(x, num_hidden=4, name='fc')
>>> z = reduce_precision(y, 'bfloat16', low_precision=['FullyConnected'], fp32=[],
...                      widest=[], data_names=['data'])
>>> from mxamp.backend.graphs import cast_nodes
>>> cast_nodes(z)[0]['name']
'data_amp_cast_bfloat16'
"""
import ctypes
from array import array

import mxnet as mx
from mxnet.symbol import Symbol

from mxamp import dtypes
from mxamp.errors import AmpArgumentError
from mxamp.backend.graphs import CAST_OPS, data_shapes_of, graph_nodes
from mxamp.lists.conditions import normalize_value
from mxamp.backend.mxnet_private import (LIB, SymbolHandle, c_array_buf, c_str_array, check_call,
                                         mx_uint)

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


def conditional_fp32_nodes(sym, lists, known_shapes=None):
    """Names of the nodes of ``sym`` whose float32 condition holds: a conditional rule of the
    lists (``conditional_fp32_ops``) or a condition of the CPU class the graph is built for.

    ``known_shapes`` maps input names to shapes; a condition on a shape that cannot be inferred
    counts as its ``if_unknown``. The graph is an inference model: ``training`` is False.

    >>> import mxnet as mx
    >>> from mxamp.precision.resolve import lists_for
    >>> lists = lists_for('bfloat16', conditional_fp32_ops=[('Convolution', 'kernel', ['(7, 7)'])])
    >>> x = mx.sym.var('data')
    >>> stem = mx.sym.Convolution(x, kernel=(7, 7), num_filter=8, name='stem')
    >>> sorted(conditional_fp32_nodes(mx.sym.Convolution(stem, kernel=(3, 3), num_filter=8), lists))
    ['stem']
    """
    rules = {op: lists.conditions(op) for op in lists.conditional_fp32}
    for op, conds in lists.device_conditions.items():
        rules[op] = tuple(rules.get(op, ())) + tuple(conds)
    nodes = graph_nodes(sym)
    candidates = [n for n in nodes if rules.get(n["op"])]
    need_shapes = [n for n in candidates if any(c.needs_shapes() for c in rules[n["op"]])]
    shapes = data_shapes_of(sym, need_shapes, known_shapes or {})
    for node in need_shapes:
        if shapes.get(node["name"]) is None:   # the data's channels, from the weight's shape
            shapes[node["name"]] = channels_from_weight(node, nodes, known_shapes or {})
    return {n["name"] for n in candidates
            if any(c.holds(n.get("attrs", {}), shapes.get(n["name"]), False)
                   for c in rules[n["op"]])}


def channels_from_weight(node, nodes, known_shapes):
    """``(0, C, 0, ...)`` for a (de)convolution in an ``NC...`` layout whose weight's shape is
    known (``known_shapes``: ``convert_model``'s parameters; or the ``__shape__`` a Gluon
    parameter declares), though its data's is not: 0 marks what stays unknown, so conditions
    on ``in_channels`` decide and those on ``spatial_size`` count as unknown. Else None.

    >>> import mxnet as mx
    >>> conv = mx.sym.Convolution(mx.sym.var('data'), kernel=(3, 3), num_filter=8, name='c')
    >>> nodes = graph_nodes(conv)
    >>> channels_from_weight(nodes[-1], nodes, {'c_weight': (8, 3, 3, 3)})
    (0, 3, 0, 0)
    """
    attrs = node.get("attrs", {})
    layout = str(attrs.get("layout", "None")).strip("'\" ")
    if node["op"] not in ("Convolution", "Deconvolution") or len(node["inputs"]) < 2 or \
            not (layout == "None" or layout.startswith("NC")):
        return None
    weight = nodes[node["inputs"][1][0]]
    shape = known_shapes.get(weight["name"]) or normalize_value(
        weight.get("attrs", {}).get("__shape__", "()"))
    if weight["op"] != "null" or not isinstance(shape, tuple) or len(shape) < 3 or \
            not all(shape[:2]):
        return None
    groups = normalize_value(attrs.get("num_group", 1))
    channels = shape[0] if node["op"] == "Deconvolution" else shape[1] * groups
    return (0, channels) + (0,) * (len(shape) - 2)


def shared_params_kept_float32(sym, params, low_precision, excluded=()):
    """Names among ``params`` that several nodes read, not all of them low-precision ops
    outside ``excluded``: tied weights (an Embedding and the output layer), a weight shared
    with an excluded layer. With ``cast_params`` MXNet's pass types such a parameter in the
    target for one reader and float32 for the other, and the graph fails its type inference
    ("Incompatible attr ... expected bfloat16, got float32"); passed to it as data, the
    parameter stays float32 and is cast once, in the graph, for its low-precision readers.

    >>> import mxnet as mx
    >>> w = mx.sym.var('w')
    >>> e = mx.sym.Embedding(mx.sym.var('data'), weight=w, input_dim=8, output_dim=4)
    >>> out = mx.sym.FullyConnected(e, weight=w, num_hidden=8, no_bias=True, flatten=False)
    >>> shared_params_kept_float32(out, {'w'}, low_precision={'FullyConnected'})
    {'w'}
    >>> shared_params_kept_float32(out, {'w'}, low_precision={'FullyConnected', 'Embedding'})
    set()
    """
    nodes = graph_nodes(sym)
    readers = {}
    for index, node in enumerate(nodes):
        for source in node.get("inputs", []):
            readers.setdefault(source[0], {})[index] = node
    low_precision, excluded = set(low_precision), set(excluded)

    def kinds(index):   # explicit casts take any dtype: the pass types those readers right
        return {r["op"] in low_precision and r["name"] not in excluded
                for r in readers.get(index, {}).values() if r["op"] not in CAST_OPS}
    return {node["name"] for index, node in enumerate(nodes)
            if node["op"] == "null" and node["name"] in params and kinds(index) == {True, False}}


def strip_output_casts(converted, original):
    """Undo the float32 casts the pass appends to each output (for ``fp32_outputs=False``)."""
    outputs = []
    for out in converted:
        name = out.name or ""
        if out.attr("dtype") == "float32" and name.endswith("_amp_cast_float32") and \
                name not in original.get_internals().list_outputs():
            out = out.get_children()[0]
        outputs.append(out)
    return outputs[0] if len(outputs) == 1 else mx.sym.Group(outputs)


def check_excluded(names, node_names):
    """``excluded_sym_names`` must name nodes of the graph (a typo would exclude nothing)."""
    unknown = sorted(set(names) - set(node_names))
    if unknown:
        raise AmpArgumentError(
            "excluded_sym_names names nodes that are not in the graph: %s (node names are e.g. "
            "%s)" % (", ".join(unknown), ", ".join(sorted(node_names)[:5])))
