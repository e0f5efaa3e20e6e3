"""The graph a hybridized block trains under mxamp: the helper the graph-treatment tests share."""
import json

import numpy

import mxnet as mx
from mxnet import autograd

from bf16_expect import CPU_CLASS
from mxamp import amp


def trained_graph_nodes(net, data_shape, o2=False):
    """The nodes (casts kept) of the graph ``net`` builds for one training step on uniform data
    of ``data_shape`` under ``amp.init('bfloat16')``, after ``amp.cast_model`` where ``o2``.
    AMP is reset after, whatever happens."""
    amp.init("bfloat16")
    try:
        if o2:
            net = amp.cast_model(net, "bfloat16")
        net.hybridize()
        with autograd.record():
            y = net(mx.nd.random.uniform(shape=data_shape))
        y.backward()
        return json.loads(net._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
    finally:
        amp.reset()


#: The dtype of the data a ``cast_model('bfloat16')`` graph takes: the model casts its input
#: to the dtype it computes in, float32 on 'none' (no bfloat16 kernels; mxamp/conversion/o2.py)
O2_GRAPH_INPUT = "float32" if CPU_CLASS == "none" else "bfloat16"


def data_dtypes(nodes, op, graph_input_dtype="bfloat16"):
    """The dtype names of the data (first input) of each ``op`` node in ``nodes``, in graph
    order, by MXNet's own type inference, the graph's data input declared
    ``graph_input_dtype`` (``cast_model``'s graphs take the target dtype)."""
    flags = {"float32": "0", "bfloat16": "12"}
    declared = [dict(n, attrs=dict(n.get("attrs", {}), __dtype__=flags[graph_input_dtype]))
                if n["op"] == "null" and n["name"] == "data" else n for n in nodes]
    heads = [n["inputs"][0] for n in nodes if n["op"] == op]
    graph = {"nodes": declared, "heads": heads, "attrs": {"mxnet_version": ["int", 10901]},
             "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"]}
    _, types, _ = mx.sym.load_json(json.dumps(graph)).infer_type_partial()
    return ["bfloat16" if t is not None and getattr(t, "names", None) else
            (None if t is None else numpy.dtype(t).name) for t in types]
