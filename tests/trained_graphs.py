"""The graph a hybridized block trains under mxamp: the helper the graph-treatment tests share."""
import json

import mxnet as mx
from mxnet import autograd

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
