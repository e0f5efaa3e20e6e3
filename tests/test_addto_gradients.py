"""Gradients MXNet adds into their buffer (``grad_req='add'``, control-flow bodies) survive
mxamp's casts (:mod:`mxamp.runtime.addto`).

MXNet 1.9.1's oneDNN ``amp_cast`` drops a gradient its backward must add: the first test shows
it in MXNet alone. The others train through mxamp's casts and check the sums, which the tests
compute themselves: all-ones inputs and weights make every gradient an exact small integer,
the same in bfloat16.
"""
import json

import pytest

import mxnet as mx
from mxnet import autograd, gluon

from bf16_expect import where
from mxamp.backend.mxnet_private import BlockView
from mxamp.dtypes import BFLOAT16


def _added(cast, passes=3):
    """The gradient of a (4,) leaf with ``grad_req='add'`` after ``passes`` backward passes
    through ``cast``; each pass contributes 1 per element."""
    w = mx.nd.ones((4,))
    w.attach_grad(grad_req="add")
    for _ in range(passes):
        with autograd.record():
            y = cast(w)
        y.backward()
    return w.grad.asnumpy()


@pytest.mark.cpu_class
def test_raw_mxnet_amp_cast_drops_added_gradients():
    """The fault itself, without mxamp's patching: why casts of such inputs need a copy."""
    assert _added(lambda w: mx.nd.amp_cast(w, dtype="float16")).tolist() == [3.0] * 4
    dropped = _added(lambda w: mx.nd.amp_cast(w, dtype=BFLOAT16))
    assert dropped.tolist() == [0.0] * 4, (
        "MXNet's bfloat16 amp_cast now adds its gradient (%s, %s): the copy in "
        "mxamp.runtime.addto may be unneeded" % (dropped, where()))


def _dense(hybridize, grad_req="add"):
    net = gluon.nn.Dense(4, in_units=8)
    net.initialize(mx.init.One())
    net.collect_params().setattr("grad_req", grad_req)
    if hybridize:
        net.hybridize()
    return net


def _passes(net, count):
    x = mx.nd.ones((2, 8))
    for _ in range(count):
        with autograd.record():
            loss = net(x).astype("float32").sum()
        loss.backward()
    return net.weight.grad().asnumpy(), net.bias.grad().asnumpy()


@pytest.mark.cpu_class
@pytest.mark.parametrize("hybridize", [False, True], ids=["imperative", "hybridized"])
def test_gradient_accumulation_adds_every_pass(hybridize, amp_bf16):
    """Three passes of a batch of two: each weight's gradient is 2 per pass, 6 in all."""
    weight, bias = _passes(_dense(hybridize), 3)
    assert weight.tolist() == [[6.0] * 8] * 4 and bias.tolist() == [6.0] * 4, (
        "accumulated gradients under amp.init('bfloat16') %s: weight %s, bias %s"
        % (where(), weight[0], bias))


@pytest.mark.cpu_class
def test_grad_req_set_to_add_after_the_graph_was_built(amp_bf16):
    """The graph built with ``grad_req='write'`` has no copies; switching to ``'add'``
    rebuilds it with them, and the passes after the switch add up."""
    net = _dense(True, grad_req="write")
    _passes(net, 1)
    nodes = BlockView(net).cached_graph[1].tojson()
    assert '"_copy"' not in nodes, "a graph without added gradients got copies"
    net.collect_params().setattr("grad_req", "add")
    net.collect_params().zero_grad()
    weight, _ = _passes(net, 3)
    assert weight.tolist() == [[6.0] * 8] * 4, "after the switch to 'add': %s" % weight[0]
    graph = json.loads(BlockView(net).cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
    direct = [n["name"] for n in graph if n["op"] in ("amp_cast", "amp_multicast") and any(
        graph[i]["op"] == "null" and graph[i]["name"] != "data" for i, *_ in n["inputs"])]
    assert not direct, "casts read a parameter with grad_req='add' directly: %s" % direct


class _Loop(gluon.HybridBlock):
    """A weight used in every step of a ``foreach`` body: MXNet adds each step's gradient."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.dense = gluon.nn.Dense(8, in_units=8, flatten=False)

    def hybrid_forward(self, F, x, state):
        def step(data, states):
            out = self.dense(data) + states[0]
            return out, [out]
        return F.contrib.foreach(step, x, [state])[0]


@pytest.mark.cpu_class
@pytest.mark.parametrize("hybridize", [False, True], ids=["imperative", "hybridized"])
def test_foreach_body_weight_gets_every_step(hybridize, amp_bf16):
    """Five steps over a batch of three with zero weights and unit biases: step t's output is
    t biases, so each bias gradient of the summed outputs is 3 * (1 + 2 + 3 + 4 + 5) = 45."""
    net = _Loop()
    net.initialize(mx.init.Zero())
    net.dense.bias.set_data(mx.nd.ones((8,)))
    if hybridize:
        net.hybridize()
    with autograd.record():
        out = net(mx.nd.ones((5, 3, 8)), mx.nd.zeros((3, 8)))
        loss = out.astype("float32").sum()
    loss.backward()
    bias = net.dense.bias.grad().asnumpy()
    assert bias.tolist() == [45.0] * 8, "foreach bias gradient %s (%s)" % (bias, where())


@pytest.mark.cpu_class
def test_symbol_built_outside_a_block_bound_with_add(amp_bf16):
    """A Symbol graph (the Module API's kind) binds ``grad_req`` after it is built: every
    variable's cast is safe. Three passes of a batch of two: 6 per weight."""
    data = mx.sym.var("data")
    out = mx.sym.FullyConnected(data, num_hidden=4, name="fc")
    loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.amp_cast(out, dtype="float32")))
    exe = loss.simple_bind(mx.cpu(), data=(2, 8), grad_req="add")
    for name, array in exe.arg_dict.items():
        array[:] = 1.0
    for grad in exe.grad_dict.values():
        grad[:] = 0.0
    for _ in range(3):
        exe.forward(is_train=True)
        exe.backward()
    weight = exe.grad_dict["fc_weight"].asnumpy()
    assert weight.tolist() == [[6.0] * 8] * 4, "Symbol graph with grad_req='add': %s" % weight[0]


@pytest.mark.cpu_class
@pytest.mark.parametrize("numpy_interface,dtype", [(False, "float32"), (True, "float32"),
                                                   (False, "float64")],
                         ids=["nd", "np", "nd-float64"])
def test_attach_grad_add_on_a_leaf(numpy_interface, dtype, amp_bf16):
    """A leaf marked with ``attach_grad(grad_req='add')`` and fed to a bfloat16 op: three
    passes of FullyConnected over a batch of two ones give its weight 2 per pass, 6 in all.
    A float64 leaf goes through ``Cast`` to float32 first, whose backward drops added
    gradients as well (it gave 2: the last pass)."""
    weight = mx.nd.ones((4, 8), dtype=dtype)
    data = mx.nd.ones((2, 8), dtype=dtype)
    if numpy_interface:
        weight, data = weight.as_np_ndarray(), data.as_np_ndarray()
    weight.attach_grad(grad_req="add")
    fully_connected = mx.npx.fully_connected if numpy_interface else mx.nd.FullyConnected
    for _ in range(3):
        with autograd.record():
            out = fully_connected(data, weight, num_hidden=4, no_bias=True)
            loss = out.astype("float32").sum()
        loss.backward()
    grad = weight.grad.as_nd_ndarray() if numpy_interface else weight.grad
    assert grad.asnumpy().tolist() == [[6.0] * 8] * 4, "leaf gradient %s (%s)" % (
        grad.asnumpy()[0], where())
