"""What MXNet 1.9.1's own AMP tests (tests/python/mkl/test_contrib_amp.py) ask of the API,
checked on mxamp in our own words, on any CPU (graphs are compared, not run in bfloat16).

``python ci/reference_suite.py /path/to/mxnet-1.9.1`` runs MXNet's file itself with mxamp in the
reference's place; on a CPU without bfloat16 kernels two of its five tests cannot run (they
execute bfloat16 graphs), for the reference and mxamp alike.
"""
import json

import mxnet as mx
import numpy as np
import pytest

from mxamp import amp
from mxamp.dtypes import BFLOAT16


def _ops(sym):
    """(op, dtype attribute) of every node in order, casts kept: MXNet's same_symbol_structure
    compares ops only, stops at the shorter graph, and ``tojson()`` drops amp_cast nodes."""
    return [(n["op"], n.get("attrs", {}).get("dtype"))
            for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]]


def _fc_plus_sin():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    return mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True) + mx.sym.sin(y), x, y


def test_convert_symbol_builds_the_reference_graph():
    res, x, y = _fc_plus_sin()
    got = amp.convert_symbol(res, target_dtype="bfloat16", target_dtype_ops=["FullyConnected"],
                             fp32_ops=["sin"])
    fc = mx.sym.FullyConnected(mx.sym.amp_cast(x, dtype=BFLOAT16),
                               mx.sym.amp_cast(y, dtype=BFLOAT16), num_hidden=10, no_bias=True)
    want = mx.sym.amp_cast(fc, dtype="float32") + mx.sym.sin(y)
    assert _ops(got) == _ops(want), "convert_symbol must build the reference's graph"


@pytest.mark.parametrize("kwargs", [
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["elemwise_add"]),
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["Activation"],
         conditional_fp32_ops=[("Activation", "act_type", ["selu"])]),
    dict(target_dtype_ops=["Activation"], fp32_ops=["Activation"],
         conditional_fp32_ops=[("Activation", "act_type", ["selu"])]),
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["FullyConnected"]),
], ids=["widest-op-in-fp32_ops", "fp32-and-conditional", "three-lists", "low-and-fp32"])
def test_conflicting_lists_raise_the_reference_assertion(kwargs):
    res, _, _ = _fc_plus_sin()
    with pytest.raises(AssertionError) as err:
        amp.convert_symbol(res, target_dtype="bfloat16", **kwargs)
    assert isinstance(err.value, ValueError), "mxamp's argument errors are also ValueErrors"
    named = kwargs["fp32_ops"][0]
    assert named in str(err.value), "the message names the op: %s" % err.value


def test_widest_override_is_an_explicit_choice():
    res, _, _ = _fc_plus_sin()
    got = amp.convert_symbol(res, target_dtype="bfloat16", target_dtype_ops=["FullyConnected"],
                             fp32_ops=["elemwise_add"], allow_widest_overrides=True)
    nodes = json.loads(got.tojson(remove_amp_cast=False))["nodes"]
    adds = [n for n in nodes if n["op"] == "elemwise_add"]
    assert len(adds) == 1, "the graph keeps its one addition: %s" % _ops(got)
    # in fp32_ops, both inputs are cast to float32; as widest (the override ignored) sin's
    # float32 output would reach it uncast
    feeding = [nodes[i] for i, _, _ in adds[0]["inputs"]]
    assert [(n["op"], n["attrs"].get("dtype")) for n in feeding] == [("amp_cast", "float32")] * 2, \
        "elemwise_add in fp32_ops gets float32 casts of both inputs: %s" % _ops(got)
    with pytest.raises(AssertionError, match="allow_widest_overrides=True"):
        amp.convert_model(res, {}, {}, target_dtype="bfloat16", fp32_ops=["elemwise_add"])


def test_conditional_ops_in_convert_symbol_match_the_reference_graphs():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    fc = mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True)
    unmet = amp.convert_symbol(fc, target_dtype="bfloat16", target_dtype_ops=[], fp32_ops=["sin"],
                               conditional_fp32_ops=[("FullyConnected", "no_bias", ["False"])])
    # MXNet 1.9.1's convert_symbol builds this very graph: the op left alone, its output cast
    # to float32 as every graph output is
    assert _ops(unmet) == [("null", None), ("null", None), ("FullyConnected", None),
                           ("amp_cast", "float32")], "a condition that does not hold: %s" % (
                               _ops(unmet),)
    met = amp.convert_symbol(fc, target_dtype="bfloat16", target_dtype_ops=[], fp32_ops=["sin"],
                             conditional_fp32_ops=[("FullyConnected", "no_bias", ["True"])])
    # MXNet 1.9.1 also puts amp_cast(float32) on the two float32 inputs (no-ops); mxamp leaves a
    # node whose condition holds as it is, so nothing in the graph is cast to bfloat16
    assert _ops(met) == _ops(fc), "a condition that holds keeps the op in float32: %s" % _ops(met)
    conv = mx.sym.Convolution(x, kernel=(1, 1), num_filter=4)
    chained = amp.convert_symbol(mx.sym.FullyConnected(conv, num_hidden=10, no_bias=True),
                                 target_dtype="bfloat16", target_dtype_ops=["Convolution"],
                                 fp32_ops=["sin"],
                                 conditional_fp32_ops=[("FullyConnected", "no_bias", ["True"])])
    low = ("amp_cast", "bfloat16")
    assert _ops(chained) == [("null", None), low, ("null", None), low, ("null", None), low,
                             ("Convolution", None), ("amp_cast", "float32"), ("null", None),
                             ("FullyConnected", None)], \
        "a bfloat16 input of an op whose condition holds is cast to float32: %s" % _ops(chained)


def _input_dtype(sym, **shapes):
    exe = sym.simple_bind(ctx=mx.cpu(), **shapes)
    return [a.dtype for a in exe.arg_arrays]


def test_casts_decide_input_dtypes_as_the_reference():
    data = mx.sym.var("data")
    to_bf16, to_f32 = mx.sym.amp_cast(data, dtype=BFLOAT16), mx.sym.amp_cast(data, dtype="float32")
    mixed = amp.convert_symbol(mx.sym.Group([to_bf16, to_f32]), data_names=[],
                               target_dtype="bfloat16", cast_optional_params=True)
    assert _input_dtype(mixed, data=(1, 2))[0] == np.float32, "used in two dtypes: float32"
    both = amp.convert_symbol(mx.sym.Group([to_bf16, mx.sym.amp_cast(data, dtype=BFLOAT16)]),
                              data_names=[], target_dtype="bfloat16", cast_optional_params=True)
    assert _input_dtype(both, data=(1, 2))[0] == BFLOAT16, "only ever bfloat16: bfloat16"
    a, b = mx.sym.var("data", dtype="float32"), mx.sym.var("data2", dtype=BFLOAT16)
    multi = amp.convert_symbol(mx.sym.amp_multicast(a, b, num_outputs=2), target_dtype="bfloat16",
                               cast_optional_params=True)
    assert _input_dtype(multi, data2=(1, 2), data=(1, 2))[0] == BFLOAT16


def test_module_keeps_the_inferred_parameter_dtypes():
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=10, kernel=(2, 3), stride=(1, 1))
    bn = mx.sym.BatchNorm(conv, eps=0.001, momentum=0.9, fix_gamma=False, name="bn")
    fc = mx.sym.FullyConnected(bn, num_hidden=10, name="fullyconnected")
    mod = mx.mod.Module(fc, data_names=["data"], context=mx.cpu())
    mod.bind(data_shapes=[["data", (1, 3, 16, 16)]])
    mod.init_params()
    args, auxs = mod.get_params()
    sym, args, auxs = amp.convert_model(fc, args, auxs, target_dtype="bfloat16",
                                        target_dtype_ops=["Convolution"])
    assert args["fullyconnected_weight"].dtype == BFLOAT16, (
        "FullyConnected, out of the low-precision list, is dtype-neutral: its input is bfloat16, "
        "so its weight is typed bfloat16")
