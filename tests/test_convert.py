"""Graph conversion (amp.convert_*): structure of converted graphs for float16 and bfloat16,
bfloat16 numerics against float32 on CPU, what converted models store, export/import round
trips (the entry points on other models, and bad input: ``test_convert_entry_points.py``).

convert_symbol/convert_model build the graph requested on every CPU (an artifact to deploy);
what mxamp builds to run here (convert_hybrid_block, convert_bucketing_module) computes in
float32 the ops this CPU has no bfloat16 kernel for: on a CPU of class 'none' it has no casts
and gives float32's outputs exactly (tests marked ``cpu_class``).
"""
import collections
import os

import mxnet as mx
import numpy as np
import pytest

from bf16_expect import BF16_KERNELS, LOW, where
from mxamp import amp
from mxamp.conversion.convert import ConvertedBlock, convert_symbol
from mxamp.lists import get_op_lists
from mxamp.backend.graphs import cast_nodes, graph_nodes, output_dtypes, param_dtypes
from mxamp.backend.mxnet_private import ParamView

# Explicit lists make the exact cast counts independent of the default list data.
FIXED_LISTS = dict(target_dtype_ops=["Convolution", "FullyConnected"], fp32_ops=["softmax"],
                   conditional_fp32_ops=[])


def rel_l2(a, b):
    a, b = a.asnumpy().astype(np.float64), b.asnumpy().astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def resnet18():
    """A Xavier-initialised, hybridized ResNet-18 that has run once, its input and fp32 output."""
    mx.random.seed(7)
    np.random.seed(7)
    net = mx.gluon.model_zoo.vision.resnet18_v1(prefix="resnetv10_")
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=(4, 3, 224, 224))
    return net, x, net(x)


def nodes_by_name(sym):
    return {n["name"]: n for n in graph_nodes(sym)}


def input_names(sym, node_name):
    nodes = graph_nodes(sym)
    node = next(n for n in nodes if n["name"] == node_name)
    return [nodes[i[0]]["name"] for i in node["inputs"]]


def assert_no_duplicate_casts(sym):
    keys = collections.Counter((tuple(c["sources"]), c["attrs"].get("dtype"))
                               for c in cast_nodes(sym))
    dupes = [k for k, n in keys.items() if n > 1]
    assert not dupes, "tensors cast more than once to the same dtype: %s" % dupes


def small_cnn_symbol():
    """data feeds two convs (one shared cast), BatchNorm, an add of two branches, FC, softmax."""
    data = mx.sym.var("data")
    a = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="conv_a")
    b = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="conv_b")
    a = mx.sym.BatchNorm(a, name="bn")
    h = mx.sym.elemwise_add(mx.sym.Activation(a, act_type="relu", name="relu"), b, name="add")
    h = mx.sym.FullyConnected(mx.sym.flatten(h, name="flat"), num_hidden=3, name="fc")
    return mx.sym.softmax(h, name="prob")


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_small_graph_casts_are_placed_once_and_bn_statistics_stay_fp32(target):
    sym = small_cnn_symbol()
    lp = convert_symbol(sym, target, **FIXED_LISTS)
    casts = {c["name"]: (c["sources"], c["attrs"]["dtype"]) for c in cast_nodes(lp)}
    # data (shared by both convs), 2 conv weights, 2 conv biases, fc weight and bias to the
    # target; fc output back to float32 for softmax. softmax is already fp32: no output cast.
    expected = {"data": target, "conv_a_weight": target, "conv_a_bias": target,
                "conv_b_weight": target, "conv_b_bias": target, "fc_weight": target,
                "fc_bias": target, "fc": "float32"}
    got = {src[0]: dt for src, dt in casts.values()}
    assert got == expected, "casts (source -> dtype) %s, expected %s" % (got, expected)
    assert_no_duplicate_casts(lp)
    bn_inputs = input_names(lp, "bn")
    assert bn_inputs[1:] == ["bn_gamma", "bn_beta", "bn_moving_mean", "bn_moving_var"], \
        "BatchNorm's gamma/beta/statistics must be read uncast, got inputs %s" % bn_inputs
    types = output_dtypes(lp)
    assert types["bn_output"] == target and types["add_output"] == target, \
        "BatchNorm and the add must run in %s on %s input, got %s/%s" % (
            target, target, types["bn_output"], types["add_output"])
    assert types["prob_output"] == "float32", "the output must come back in float32"
    assert [types[n] for n in ("bn_gamma", "bn_moving_var")] == ["float32", "float32"], \
        "BatchNorm parameters must stay float32"


def test_widest_multicast_conditional_fp32_and_shared_fp32_cast():
    data, skip = mx.sym.var("data"), mx.sym.var("skip")
    fc = mx.sym.FullyConnected(data, num_hidden=4, name="fc")
    graph = mx.sym.Group([
        mx.sym.elemwise_add(fc, skip, name="add"),                 # fp16 + unknown: multicast
        mx.sym.elemwise_add(mx.sym.softmax(fc, name="sm"), fc, name="add2"),  # fp32 + fp16
        mx.sym.Activation(fc, act_type="softrelu", name="sr"),     # conditional: fp32
        mx.sym.Activation(fc, act_type="relu", name="rl")])        # stays fp16
    lp = convert_symbol(graph, "float16", target_dtype_ops=["FullyConnected"],
                        fp32_ops=["softmax"],
                        conditional_fp32_ops=[("Activation", "act_type", ["softrelu"])])
    casts = cast_nodes(lp)
    multicasts = [c["sources"] for c in casts if c["op"] == "amp_multicast"]
    assert multicasts == [["fc", "skip"]], \
        "one amp_multicast over add's inputs, got %s" % multicasts
    fc_to_fp32 = [c for c in casts
                  if c["sources"] == ["fc"] and c["attrs"].get("dtype") == "float32"]
    assert len(fc_to_fp32) == 1, "softmax, add2 and softrelu must share one fp32 cast of fc"
    types = output_dtypes(lp)
    got = {n: types[n + "_output"] for n in ("sr", "rl", "add2")}
    assert got == {"sr": "float32", "rl": "float16", "add2": "float32"}, \
        "softrelu fp32, relu fp16, fp32+fp16 add in fp32; got %s" % got
    assert_no_duplicate_casts(lp)


def test_fp32_outputs_false_keeps_the_low_precision_output():
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    kept = convert_symbol(fc, "bfloat16", fp32_outputs=False, **FIXED_LISTS)
    default = convert_symbol(fc, "bfloat16", **FIXED_LISTS)
    assert output_dtypes(kept)[kept.list_outputs()[0]] == "bfloat16", \
        "fp32_outputs=False must leave the FC output in bfloat16"
    assert output_dtypes(default)[default.list_outputs()[0]] == "float32", \
        "by default the output is cast back to float32"


def test_excluded_node_stays_fp32_and_its_low_precision_input_is_cast_back():
    sym = small_cnn_symbol()
    lp = convert_symbol(sym, "float16", excluded_sym_names=["fc"], **FIXED_LISTS)
    types = output_dtypes(lp)
    assert types["fc_output"] == "float32", "excluded fc must run in float32"
    assert not any(c["sources"][0].startswith("fc_") for c in cast_nodes(lp)), \
        "the excluded fc's weight and bias must not be cast"
    fc_data = input_names(lp, "fc")[0]
    assert types[fc_data + "_output"] == "float32", \
        "the fc's float16 input must be cast back to float32, got %s" % types[fc_data + "_output"]


def test_cast_optional_params_types_weights_in_target_dtype():
    sym = small_cnn_symbol()
    lp = convert_symbol(sym, "bfloat16", data_names=["data"], cast_optional_params=True,
                        **FIXED_LISTS)
    wanted = param_dtypes(lp)
    assert wanted["conv_a_weight"] == "bfloat16" and wanted["fc_bias"] == "bfloat16", \
        "weights must be typed bfloat16, got %s" % wanted
    assert wanted["bn_gamma"] == "float32" and wanted["bn_moving_mean"] == "float32", \
        "BatchNorm parameters stay float32, got %s" % wanted
    sources = [c["sources"][0] for c in cast_nodes(lp)]
    assert sources == ["data", "fc"], "only data and the fc output are cast, got %s" % sources


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_resnet18_graph_structure(resnet18, target):
    net, _, _ = resnet18
    # the reference's storage (float32 weights cast in the graph), whose casts are counted here
    lp = convert_symbol(net._cached_graph[1], target, data_names=["data"],
                        cast_optional_params=False, **FIXED_LISTS)
    casts = cast_nodes(lp)
    by_dtype = collections.Counter(c["attrs"]["dtype"] for c in casts)
    # data + 20 conv weights + FC weight + FC bias to the target, the output back to fp32.
    assert by_dtype == {target: 23, "float32": 1}, "ResNet-18 casts: %s" % dict(by_dtype)
    assert_no_duplicate_casts(lp)
    types = output_dtypes(lp)
    nodes = graph_nodes(lp)
    for node in nodes:
        if node["op"] == "Convolution":
            ins = [nodes[i[0]]["name"] + ("_output" if nodes[i[0]]["op"] != "null" else "")
                   for i in node["inputs"]]
            assert {types[i] for i in ins} == {target}, "%s inputs %s not all %s" % (
                node["name"], ins, target)
        if node["op"] == "BatchNorm":
            params = [nodes[i[0]] for i in node["inputs"][1:]]
            assert all(p["op"] == "null" and types[p["name"]] == "float32" for p in params), \
                "%s must read its parameters uncast in float32" % node["name"]
    out_name = lp.list_outputs()[0]
    assert types[out_name] == "float32", "the output must be float32"


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_default_lists_give_a_consistent_graph(resnet18, target):
    net, _, _ = resnet18
    lists = get_op_lists(target)
    lp = convert_symbol(net._cached_graph[1], target, data_names=["data"])
    assert_no_duplicate_casts(lp)
    types = output_dtypes(lp)
    nodes = graph_nodes(lp)
    checked = collections.Counter()
    for node in nodes:
        if node["op"] in lists.low_precision:
            data_in = nodes[node["inputs"][0][0]]
            name = data_in["name"] + ("" if data_in["op"] == "null" else "_output")
            assert types[name] == target, "%s (%s) reads %s data" % (
                node["name"], node["op"], types[name])
            checked[node["op"]] += 1
    # convert_symbol builds the requested graph on every CPU: ResNet-18 v1's 20 convolutions
    # and its one Dense are low precision in both default lists
    assert checked == {"Convolution": 20, "FullyConnected": 1}, dict(checked)
    assert types[lp.list_outputs()[0]] == "float32", "the output must be float32"


def assert_runs_here(lp, out, ref, max_err=0.02):
    """A converted block mxamp built to run here: bfloat16 casts and bfloat16 error where this CPU
    has bfloat16 kernels; no cast and float32's outputs bit for bit where it has none.

    ``max_err``: the relative L2 errors of the blocks that use it measured 7.2e-4 to 4.9e-3
    (Zen 4, native and emulated alike; ResNet-18 4.0e-3, the numpy Conv/BatchNorm block
    4.9e-3; not measured on AMX): 0.02 is 4x the largest."""
    casts = cast_nodes(lp._cached_graph[1])
    outs, refs = (out, ref) if isinstance(out, (list, tuple)) else ((out,), (ref,))
    if BF16_KERNELS:
        assert casts and casts[0]["attrs"]["dtype"] == "bfloat16", \
            "a bfloat16 graph %s must have bfloat16 casts, got %s" % (where(), casts[:2])
        errors = [rel_l2(o, r) for o, r in zip(outs, refs)]
        assert max(errors) < max_err, "bf16 relative L2 errors %s >= %g" % (errors, max_err)
    else:
        assert not casts, "%s the block must compute in float32 without casts: %s" % (
            where(), [c["name"] for c in casts][:4])
        for o, r in zip(outs, refs):
            assert np.array_equal(o.asnumpy(), r.asnumpy()), \
                "float32 compute %s must give float32's outputs bit for bit" % where()


@pytest.mark.cpu_class
def test_resnet18_bf16_numerics_and_top1(resnet18):
    net, x, ref = resnet18
    lp = amp.convert_hybrid_block(net)  # defaults: the block's CPU context, hence bfloat16
    out = lp(x)
    assert out.dtype == np.float32, "output must be float32, got %s" % out.dtype
    assert_runs_here(lp, out, ref)
    agree = int((out.argmax(axis=1) == ref.argmax(axis=1)).sum().asscalar())
    assert agree == x.shape[0], "top-1 agrees on %d of %d images" % (agree, x.shape[0])
    assert lp.collect_params()["resnetv10_conv0_weight"].data().context == mx.cpu(), \
        "ctx=None must keep the parameters on the block's CPU context"


def _param_bytes(block):
    """{dtype name: bytes} of a block's parameters, counted from the arrays themselves."""
    out = collections.Counter()
    for param in block.collect_params().values():
        data = param.data()
        out[np.dtype(data.dtype).name if np.dtype(data.dtype).names is None else "bfloat16"] += \
            data.size * np.dtype(data.dtype).itemsize
    return out


@pytest.mark.cpu_class
def test_a_converted_model_stores_what_it_computes(resnet18, tmp_path):
    """By default (cast_optional_params=None) the weights of ops that compute in bfloat16 are
    stored in bfloat16 where this CPU computes it (tests/bf16_expect.py: classes other than
    'none'); BatchNorm's parameters and statistics, consumed in float32, stay float32; on class
    'none' nothing changes. cast_optional_params=False is the reference's float32 storage."""
    net, x, _ = resnet18
    fp32 = _param_bytes(net)
    stored = _param_bytes(amp.convert_hybrid_block(net, "bfloat16"))
    reference = _param_bytes(amp.convert_hybrid_block(net, "bfloat16", cast_optional_params=False))
    assert reference == fp32, "cast_optional_params=False keeps float32 weights: %s" % reference
    total = sum(fp32.values())
    if BF16_KERNELS:
        # ResNet-18: 99.9% of its 11.7M parameters are convolution and dense weights
        assert sum(stored.values()) <= 0.6 * total, (stored, fp32, where())
        assert stored["float32"] > 0, "BatchNorm's parameters and statistics stay float32"
    else:
        assert stored == fp32, "class 'none' computes float32: nothing changes %s" % where()
    lp = amp.convert_hybrid_block(net, "bfloat16")
    prefix = str(tmp_path / "r18")
    lp.export(prefix)
    size = os.path.getsize(prefix + "-0000.params")
    assert (size <= 0.6 * total) == BF16_KERNELS, "the .params file holds %d of %d bytes %s" % (
        size, total, where())
    back = mx.gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    assert _param_bytes(back) == stored, "import gives back the stored dtypes"
    assert float((back(x) - lp(x)).abs().max().asscalar()) == 0.0


def test_a_converted_model_holds_no_gradient_buffers(resnet18):
    """An inference model: no parameter of the converted block carries a gradient array (the
    float32 model's 11.7 M gradients would be 45 MB at ResNet-18 size), until asked."""
    net, x, _ = resnet18
    lp = amp.convert_hybrid_block(net, "bfloat16")
    params = list(lp.collect_params().values())
    assert all(p.grad_req == "null" for p in params)
    assert all(ParamView(p).grad is None for p in params), "gradient buffers were allocated"
    lp(x).wait_to_read()
    weight = params[0]
    weight.grad_req = "write"
    assert weight.grad().shape == weight.data().shape, "grad_req='write' brings it back"


@pytest.mark.cpu_class
def test_export_import_round_trip_keeps_casts_and_outputs(resnet18, tmp_path):
    net, x, _ = resnet18
    lp = amp.convert_hybrid_block(net, "bfloat16", cast_optional_params=True)
    assert isinstance(lp, ConvertedBlock)
    out = lp(x)
    prefix = str(tmp_path / "r18bf16")
    lp.export(prefix)
    back = mx.gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    n_before, n_after = len(cast_nodes(lp._cached_graph[1])), len(cast_nodes(back._cached_graph[1]))
    assert n_before == n_after and (n_before > 0) == BF16_KERNELS, \
        "casts before/after export %s: %d/%d" % (where(), n_before, n_after)
    weight = back.collect_params()["resnetv10_conv0_weight"].data()
    assert weight.dtype == LOW, "imported conv weight is %s, not %s %s" % (weight.dtype, LOW,
                                                                         where())
    diff = float((back(x) - out).abs().max().asscalar())
    assert diff == 0.0, "outputs differ by %g after the export/import round trip" % diff
