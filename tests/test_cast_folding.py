"""Cast round trips folded out of ``cast_model``'s graphs (``mxamp/runtime/cast_folding.py``).

The expectations are MXNet's own results: a graph without the casts, run in float32, is what
a folded stretch must compute bit for bit, and the graph with the casts is what every value
leaving the stretch in bfloat16 must equal. The model test reads the classes from
``tests/bf16_expect.py`` (CPU flags and caps), never from mxamp's plan.
"""
import json

import mxnet as mx
import numpy as np
import pytest

from bf16_expect import CPU_CLASS, where
from trained_graphs import O2_GRAPH_INPUT, data_dtypes, trained_graph_nodes
from mxamp import dtypes
from mxamp.runtime.cast_folding import fold_round_trips

BF16 = dtypes.BFLOAT16


def _down(s):
    return mx.sym.amp_cast(s, dtype=BF16)


def _up(s):
    return mx.sym.amp_cast(s, dtype="float32")


def _run(sym, x, head_grads=None):
    """(outputs as float32 numpy, gradient of x) of ``sym`` on ``x``, in MXNet's executor."""
    grad = mx.nd.zeros(x.shape)
    ex = sym.bind(mx.cpu(), {"x": x}, args_grad={"x": grad})
    outs = ex.forward(is_train=True)
    ex.backward([mx.nd.ones(o.shape, dtype=o.dtype) for o in outs] if head_grads is None
                else head_grads)
    return [mx.nd.amp_cast(o, dtype="float32").asnumpy() for o in outs], grad.asnumpy()


def _ops(sym):
    return [n["op"] for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]]


def _shuffle(a, b):
    """A ShuffleNet-style join: concatenate, shuffle the channels by a reshape, swap, reshape."""
    joined = mx.sym.Concat(a, b, dim=1)
    shuffled = mx.sym.SwapAxis(mx.sym.reshape(joined, shape=(0, -4, 2, -1, -2)), dim1=1, dim2=2)
    return mx.sym.reshape(shuffled, shape=(0, -3, -2))


def _exp_x():
    return mx.sym.exp(mx.sym.var("x", dtype="float32") * 0.1)


X = mx.nd.array(np.random.RandomState(0).uniform(-3, 3, (2, 4, 3, 3)).astype(np.float32))


def test_a_folded_stretch_computes_what_float32_computes_forward_and_backward():
    """Two float32 values rounded to bfloat16, joined by a channel shuffle and a ReLU, widened
    again for a float32 consumer: the folded graph drops all four casts, and its output and
    gradient equal, bit for bit, those of the same graph MXNet builds without casts."""
    a, b = _exp_x(), mx.sym.sigmoid(_exp_x())
    plain = mx.sym.sum(mx.sym.relu(_shuffle(a, b)) * 3.0)
    with_casts = mx.sym.sum(_up(mx.sym.relu(_shuffle(_down(a), _down(b)))) * 3.0)
    folded = fold_round_trips(with_casts, "bfloat16")
    assert "amp_cast" not in _ops(folded), _ops(folded)
    (want,), want_grad = _run(plain, X)
    (got,), got_grad = _run(folded, X)
    (rounded,), _ = _run(with_casts, X)
    assert rounded != want, "the casts changed nothing: this test would prove nothing"
    assert got == want and np.array_equal(got_grad, want_grad), (got, want)


def test_a_value_leaving_for_a_bfloat16_reader_is_rounded_where_it_leaves():
    """The ReLU's output goes to a float32 consumer and, as a graph output, in bfloat16. The
    folded graph computes the ReLU once, in float32, and rounds it where it leaves: that
    output keeps its dtype and equals the unfolded graph's bit for bit (rounding commutes
    with ReLU), and the float32 consumer gets the value float32 computes."""
    relu = mx.sym.relu(_down(_exp_x()))
    with_casts = mx.sym.Group([mx.sym.sum(_up(relu)), relu])
    folded = fold_round_trips(with_casts, "bfloat16")
    assert _ops(folded).count("amp_cast") == 1, _ops(folded)
    assert folded.infer_type(x="float32")[1] == with_casts.infer_type(x="float32")[1]
    grads = [mx.nd.ones((1,)), mx.nd.amp_cast(mx.nd.ones(X.shape), dtype=BF16)]
    (total, leaving), _ = _run(folded, X, grads)
    (_, leaving_before), _ = _run(with_casts, X, grads)
    (float32_total,), _ = _run(mx.sym.sum(mx.sym.relu(_exp_x())), X)
    assert np.array_equal(leaving, leaving_before)
    assert total == float32_total


def test_a_batchnorm_reading_a_rounding_computes_in_float32_and_rounds_after():
    """A BatchNorm (float32 parameters, any data dtype) reading a rounded float32 value: the
    folded graph computes it on the float32 value and rounds its output, so the output is
    bit for bit MXNet's float32 BatchNorm rounded to bfloat16, in the same dtype."""
    def graph(data):
        names = ("gamma", "beta", "mean", "var")
        return mx.sym.BatchNorm(data, *[mx.sym.var(n, dtype="float32") for n in names],
                                fix_gamma=False, name="bn")
    with_casts = graph(_down(_exp_x()))
    folded = fold_round_trips(with_casts, "bfloat16")
    assert _ops(folded) == ["null", "_mul_scalar", "exp", "null", "null", "null", "null",
                            "BatchNorm", "amp_cast"], _ops(folded)
    assert folded.infer_type(x="float32")[1] == with_casts.infer_type(x="float32")[1]
    args = {"x": X, "gamma": mx.nd.ones((4,)) * 1.5, "beta": mx.nd.ones((4,)) * 0.25}
    aux = {"mean": mx.nd.zeros((4,)), "var": mx.nd.ones((4,))}

    def forward(sym):
        out = sym.bind(mx.cpu(), args, aux_states=dict(aux)).forward(is_train=True)[0]
        return mx.nd.amp_cast(out, dtype="float32").asnumpy()
    assert np.array_equal(forward(folded), forward(_down(graph(_exp_x()))))


def test_graphs_without_round_trips_come_back_unchanged():
    """A rounding whose values only reach bfloat16 readers, and a bfloat16 variable widened
    for a float32 operator (an O2 weight), are not round trips: the graph is returned as is."""
    x = mx.sym.var("x", dtype="float32")
    weight = mx.sym.var("w", dtype=BF16)
    graph = mx.sym.Group([mx.sym.relu(_down(x)), mx.sym.exp(_up(weight))])
    assert fold_round_trips(graph, "bfloat16") is graph


def test_casts_to_the_dtype_a_value_has_are_dropped():
    """``amp_cast`` to float32 of a float32 value (mxamp's layer wrapper and the patched
    operator both casting) is an identity: it goes, and the result is the same."""
    x = mx.sym.var("x", dtype="float32")
    graph = mx.sym.sum(mx.sym.exp(_up(_up(x) * 0.1)))
    folded = fold_round_trips(graph, "bfloat16")
    assert "amp_cast" not in _ops(folded), _ops(folded)
    assert _run(folded, X)[0] == _run(graph, X)[0]
    # one that is a graph output stays: an output remains an operator's, not an input
    assert _ops(fold_round_trips(mx.sym.Group([graph, _up(x)]), "bfloat16")).count("amp_cast") == 1


class _ShuffleUnit(mx.gluon.HybridBlock):
    """ShuffleNet V2's stride-1 unit at 24 channels: half the channels pass, the other half go
    through a 1x1 convolution, a depthwise 3x3 and a 1x1, each with a BatchNorm; then the
    halves join and shuffle."""

    def __init__(self, half=12, **kwargs):
        super().__init__(**kwargs)
        nn = mx.gluon.nn
        self.half = half
        self.branch = nn.HybridSequential()
        for kernel, groups, relu in ((1, 1, True), (3, half, False), (1, 1, True)):
            self.branch.add(nn.Conv2D(half, kernel, padding=kernel // 2, groups=groups,
                                      in_channels=half, use_bias=False),
                            nn.BatchNorm(in_channels=half))
            if relu:
                self.branch.add(nn.Activation("relu"))

    def hybrid_forward(self, F, x):
        kept = F.slice_axis(x, axis=1, begin=0, end=self.half)
        worked = F.slice_axis(x, axis=1, begin=self.half, end=2 * self.half)
        joined = F.concat(kept, self.branch(worked), dim=1)
        shuffled = F.swapaxes(F.reshape(joined, shape=(0, -4, 2, -1, -2)), 1, 2)
        return F.reshape(shuffled, shape=(0, -3, -2))


@pytest.mark.cpu_class
def test_o2_shufflenet_units_train_without_round_trips():
    """Two ShuffleNet V2 units at 24 channels under ``cast_model('bfloat16')``. On the classes
    without AMX every convolution and BatchNorm there trains in float32 (channel rules), so
    the graph rounds no float32 value only to widen it again: no ``amp_cast`` reads another,
    none reads a data-movement op that reads one, and the BatchNorms get float32 data (MXNet's
    type inference). On 'amx' (no such rules) they get bfloat16; on 'none' the model
    computes in float32."""
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(_ShuffleUnit(), _ShuffleUnit())
    net.initialize()
    nodes = trained_graph_nodes(net, (2, 24, 8, 8), o2=True)
    expected = {"native": "float32", "emulated": "float32", "amx": "bfloat16",
                "none": "float32"}[CPU_CLASS]
    assert set(data_dtypes(nodes, "BatchNorm", O2_GRAPH_INPUT)) == {expected}, where()
    if CPU_CLASS in ("native", "emulated"):
        passing = ("amp_cast", "Activation", "Concat", "concat", "Reshape", "SwapAxis",
                   "slice_axis")

        def reaches_a_cast(i):
            node = nodes[i]
            return node["op"] == "amp_cast" or (
                node["op"] in passing and any(reaches_a_cast(e[0]) for e in node["inputs"]))
        round_trips = [n["name"] for n in nodes if n["op"] == "amp_cast"
                       and n["attrs"]["dtype"] == "float32"
                       and reaches_a_cast(n["inputs"][0][0])]
        assert not round_trips, (round_trips, where())
