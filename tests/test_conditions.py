"""Conditional float32 rules mean what they say, on every path, and the AMX guard holds.

A conditional rule runs an op in float32 where its condition holds and leaves it in its own
list elsewhere (issue: ``conditional_fp32_ops=[('Convolution', 'kernel', ['(9, 9)'])]`` used to
send every convolution to float32). Values match as users write them. The CPU-class rule that
keeps AMX's heap-corrupting 1x1 convolutions in float32 is checked with the class forced to
'amx' on any CPU, by the decisions and graphs mxamp builds; shapes that rule sends to float32
also run here, since they compute in float32 whatever the CPU. These tests check decisions
only: none depends on what this CPU computes, so none carries the ``cpu_class`` marker.
"""
import mxnet as mx
import numpy as np
import pytest

from mxamp import amp
from mxamp.lists import get_op_lists
from mxamp.lists.conditions import Condition, normalize_value, shape_value, value_matches


def _in_layer_order(names):
    """Layer names by their number: Gluon numbers layers per process, and conv9 comes before
    conv10."""
    return sorted(names, key=lambda n: int("".join(c for c in n if c.isdigit())))


def _graph_casts(sym):
    """{op node name: the dtype its data input has in the graph} (inputs typed float32; None
    where MXNet cannot tell, as for an input of unknown dtype)."""
    internals = sym.get_internals()
    found = {}
    for name in internals.list_outputs():
        if not name.endswith("_output"):
            continue
        node = internals[name]
        if node.attr("op_name") in ("amp_cast", "amp_multicast") or "amp_cast" in name:
            continue
        children = node.get_children()
        if children is None:
            continue
        data = children[0]
        args = {n: np.float32 for n in data.list_arguments() if "__dtype__" not in
                (data.attr_dict().get(n) or {})}
        try:
            _, out, _ = data.infer_type_partial(**args)
        except mx.base.MXNetError:
            out = [None]
        dtype = out[0] if out else None
        found[name[:-len("_output")]] = None if dtype is None else \
            ("bfloat16" if np.dtype(dtype).names else np.dtype(dtype).name)
    return found


# ------------------------------------------------------------------ the data, any machine
@pytest.mark.parametrize("written, actual", [
    ("(7, 7)", (7, 7)), ((7, 7), (7, 7)), ([7, 7], (7, 7)), ("7", (7, 7)), ("softrelu", "softrelu"),
    ("True", True), ("%32", 64), ("16..64", 36), ("<=4", 3), (">=24", 24)])
def test_values_match_as_users_write_them(written, actual):
    assert value_matches(normalize_value(actual), written), (
        "%r must match the value %r" % (written, actual))


@pytest.mark.parametrize("written, actual", [
    ("(9, 9)", (7, 7)), ("7", (7, 1)), ("%32", 48), ("16..64", 65), ("<=4", 5), (">=24", 23),
    ("%16", (1, 1))])
def test_values_that_differ_do_not_match(written, actual):
    assert not value_matches(normalize_value(actual), written), (
        "%r must not match the value %r" % (written, actual))


def test_shape_words_read_the_data_input():
    assert shape_value("in_channels", {}, (8, 3, 224, 224)) == 3
    assert shape_value("spatial_size", {}, (8, 3, 7, 9)) == 63
    assert shape_value("in_channels", {"layout": "NHWC"}, (8, 7, 9, 3)) == 3, "layout NHWC"
    assert shape_value("depthwise", {"num_group": 32}, (1, 32, 8, 8)) is True
    assert shape_value("depthwise", {"num_group": 1}, (1, 32, 8, 8)) is False
    # 0 means unknown in MXNet's partial shapes: the batch does not matter to these words
    assert shape_value("spatial_size", {}, (0, 3, 8, 8)) == 64
    assert shape_value("spatial_size", {}, (0, 3, 0, 0)) is None
    assert shape_value("in_channels", {}, (0, 3, 0, 0)) == 3
    assert shape_value("in_channels", {}, (8, 0, 8, 8)) is None
    assert shape_value("in_channels", {}, None) is None


def test_unknown_shapes_count_as_the_rule_says():
    safety = Condition((("in_channels", ("%32",)),), if_unknown=True)
    speed = Condition((("in_channels", ("%32",)),), if_unknown=False)
    assert safety.holds({}, None) and not speed.holds({}, None)
    assert safety.holds({}, (1, 64, 6, 6)) and not safety.holds({}, (1, 48, 6, 6))


def test_missing_parameters_take_mxnet_defaults():
    one_by_one = Condition((("kernel", ("1",)), ("stride", ("1",))))
    assert one_by_one.holds({"kernel": (1, 1)}), "stride defaults to 1"
    assert not one_by_one.holds({"kernel": (1, 1), "stride": (2, 2)})
    assert not one_by_one.holds({}), "a kernel is required: absent means unknown, not 1"


def test_amx_rule_covers_the_measured_family_with_its_margin():
    rule = get_op_lists("bfloat16").fp32_when("amx")["Convolution"][0]
    assert rule.if_unknown, "the heap rule holds where shapes are unknown (safety first)"
    conv = {"kernel": (1, 1), "stride": (1, 1)}
    measured = [(c, 1, hw) for c in (32, 64, 128, 256, 512, 1024, 2048)
                for hw in (27, 33, 36, 39, 42, 45, 48)]
    missed = [s for s in measured if not rule.holds(conv, (4,) + s)]
    assert not missed, "the AMX rule misses measured heap-corrupting shapes: %s" % missed
    # the documented scan (NOTES.md section 2): only these sizes crashed, every H*W 1..600
    assert rule.holds(conv, (1, 48, 6, 5)) and rule.holds(conv, (1, 64, 7, 4)), "the margin"
    assert not rule.holds(conv, (1, 64, 7, 7)), "49 pixels (ResNet-50 at 224) scanned safe"
    assert not rule.holds(conv, (1, 64, 5, 5)), "25 pixels scanned safe"
    assert not rule.holds(conv, (1, 64, 14, 14)), "196 pixels is far from the family"
    assert not rule.holds({"kernel": (3, 3)}, (1, 64, 6, 6)), "3x3 convolutions passed"
    assert not rule.holds(dict(conv, stride=(2, 2)), (1, 64, 6, 6)), "stride 2 passed"
    assert not rule.holds(conv, (1, 3, 6, 6)), "C_in 3 is not a multiple of 16"
    for cls in ("none", "emulated", "native"):
        rules = get_op_lists("bfloat16").fp32_when(cls).get("Convolution", ())
        assert rule not in rules, "only 'amx' has the heap rule"


# ------------------------------------------------------- conditional lists, every path
def test_a_condition_that_holds_nowhere_changes_nothing(forced_class):
    """Checks decisions only (class 'native' forced by ``forced_class``)."""
    forced_class("native")
    amp.init("bfloat16", conditional_fp32_ops=[("Convolution", "kernel", ["(9, 9)"])])
    for kernel in ((7, 7), (3, 3), "(7, 7)"):
        got, why = amp.precision_of("Convolution", kernel=kernel)
        assert got == "bfloat16", "kernel %r matches no condition: %s (%s)" % (kernel, got, why)
    assert amp.precision_of("Convolution", kernel=(9, 9))[0] == "float32"
    assert amp.precision_of("Convolution", kernel="(9, 9)")[0] == "float32", "string form"


def test_conditional_lists_in_symbols_and_hybridized_graphs(forced_class):
    """Checks decisions only (class 'native' forced by ``forced_class``)."""
    forced_class("native")
    amp.init("bfloat16", conditional_fp32_ops=[("Convolution", "kernel", ["(7, 7)"])])
    x = mx.sym.var("data")
    stem = mx.sym.Convolution(x, kernel=(7, 7), num_filter=8, name="stem")
    body = mx.sym.Convolution(stem, kernel=(3, 3), num_filter=8, name="body")
    casts = _graph_casts(body)
    assert casts["stem"] == "float32" and casts["body"] == "bfloat16", casts

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 7, in_channels=3), mx.gluon.nn.Conv2D(8, 3, in_channels=8))
    net.initialize()
    graph = net(mx.sym.var("data"))   # the graph hybridize() builds
    casts = _graph_casts(graph)
    conv0, conv1 = _in_layer_order(n for n in casts if n.endswith("fwd"))
    assert casts[conv0] == "float32" and casts[conv1] == "bfloat16", casts


def test_conditional_lists_in_convert(forced_class):
    """Checks decisions only (class 'native' forced by ``forced_class``)."""
    forced_class("native")
    x = mx.sym.var("data")
    stem = mx.sym.Convolution(x, kernel=(7, 7), num_filter=8, name="stem")
    body = mx.sym.Convolution(stem, kernel=(3, 3), num_filter=8, name="body")
    for written in ("(7, 7)", (7, 7), "7"):
        lp = amp.convert_symbol(body, "bfloat16",
                                conditional_fp32_ops=[("Convolution", "kernel", [written])])
        casts = _graph_casts(lp)
        assert casts["stem"] == "float32" and casts["body"] == "bfloat16", (written, casts)
    lp = amp.convert_symbol(body, "bfloat16",
                            conditional_fp32_ops=[("Convolution", "kernel", ["(9, 9)"])])
    casts = _graph_casts(lp)
    assert casts["stem"] == "bfloat16" and casts["body"] == "bfloat16", (
        "no condition holds: both convolutions stay in the low-precision list: %s" % casts)


def test_shape_conditions_in_ndarray_symbol_and_convert(forced_class):
    """The stem (few input channels) in float32: a condition on a shape, on every path.
    Checks decisions only (class 'native' forced by ``forced_class``)."""
    forced_class("native")
    stem_rule = [("Convolution", "in_channels", ["<=4"])]
    amp.init("bfloat16", conditional_fp32_ops=stem_rule)
    assert amp.precision_of("Convolution", data_shape=(8, 3, 64, 64), kernel=(7, 7))[0] == \
        "float32"
    assert amp.precision_of("Convolution", data_shape=(8, 64, 16, 16), kernel=(3, 3))[0] == \
        "bfloat16"
    got, why = amp.precision_of("Convolution", kernel=(3, 3))
    assert got == "bfloat16", "an unknown shape leaves a speed rule off: %s" % why
    x = mx.sym.var("data", shape=(8, 3, 64, 64))
    stem = mx.sym.Convolution(x, kernel=(7, 7), num_filter=16, name="stem")
    body = mx.sym.Convolution(stem, kernel=(3, 3), num_filter=16, name="body")
    casts = _graph_casts(body)
    assert casts["stem"] == "float32" and casts["body"] == "bfloat16", casts
    amp.reset()
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(16, 7, in_channels=3), mx.gluon.nn.Conv2D(16, 3, in_channels=16))
    net.initialize()
    lp = amp.convert_symbol(net(mx.sym.var("data", shape=(8, 3, 64, 64))), "bfloat16",
                            conditional_fp32_ops=stem_rule)
    casts = _graph_casts(lp)
    conv0, conv1 = _in_layer_order(n for n in casts if n.endswith("fwd"))
    assert casts[conv0] == "float32" and casts[conv1] == "bfloat16", casts


def test_condition_entries_are_checked():
    with pytest.raises(ValueError, match="conditional_fp32_ops entries must be"):
        amp.init("bfloat16", conditional_fp32_ops=[("Convolution", "kernel")])
    assert not amp.is_initialized(), "a refused init leaves nothing patched"
    with pytest.raises(ValueError, match="unknown|not a registered|Convolutoin"):
        amp.init("bfloat16", conditional_fp32_ops=[("Convolutoin", "kernel", ["1"])])
    assert not amp.is_initialized()


# ------------------------------------------------------------ the AMX guard, any machine
GUARDED = (2, 64, 6, 6)        # 1x1, C_in 64, H*W 36: the measured heap corruption
FREE = (2, 64, 14, 14)         # H*W 196: far from the family


def test_amx_guard_decisions_in_patching(forced_class):
    """Checks decisions only (class 'amx', then 'native', forced by ``forced_class``)."""
    forced_class("amx")
    amp.init("bfloat16")
    got, why = amp.precision_of("Convolution", data_shape=GUARDED, kernel=(1, 1), num_filter=64)
    assert got == "float32" and "heap" in why, (got, why)
    assert amp.precision_of("Convolution", data_shape=FREE, kernel=(1, 1))[0] == "bfloat16"
    assert amp.precision_of("Convolution", data_shape=GUARDED, kernel=(3, 3))[0] == "bfloat16"
    got, why = amp.precision_of("Convolution", kernel=(1, 1))
    assert got == "float32", "an unknown shape counts as the heap-corrupting one: %s" % why
    assert amp.precision_of("Convolution", data_shape=GUARDED, kernel=(1, 1),
                            on_cpu=False)[0] == "bfloat16", "the rule is the CPU's, not a GPU's"
    amp.reset()
    forced_class("native")
    amp.init("bfloat16")
    assert amp.precision_of("Convolution", data_shape=GUARDED, kernel=(1, 1))[0] == "bfloat16", \
        "without AMX these shapes run in bfloat16"


@pytest.mark.parametrize("cls", ["emulated", "native", "amx"])
def test_depthwise_speed_rule_decisions(forced_class, cls):
    """Checks decisions only (the class forced by ``forced_class``): a depthwise convolution
    whose channel count is off oneDNN's 16-channel blocks computes in float32 on every class
    with bfloat16 kernels; a multiple of 16, a dense convolution or an unknown shape stays."""
    forced_class(cls)
    amp.init("bfloat16")
    dw = dict(kernel=(3, 3), num_filter=72, num_group=72)
    got, why = amp.precision_of("Convolution", data_shape=(8, 72, 28, 28), **dw)
    assert got == "float32" and "multiple of 16" in why, (got, why)
    assert amp.precision_of("Convolution", data_shape=(8, 64, 28, 28), kernel=(3, 3),
                            num_filter=64, num_group=64)[0] == "bfloat16"
    assert amp.precision_of("Convolution", data_shape=(8, 72, 28, 28), kernel=(3, 3),
                            num_filter=72)[0] == "bfloat16", "dense convolutions are not concerned"
    assert amp.precision_of("Convolution", **dw)[0] == "bfloat16", \
        "a speed rule leaves an unknown shape in bfloat16"


def test_amx_guard_in_symbols_and_hybridized_blocks(forced_class):
    """Checks decisions only (class 'amx' forced by ``forced_class``; runs float32 only)."""
    forced_class("amx")
    amp.init("bfloat16")
    x = mx.sym.var("data", shape=GUARDED)
    c1 = mx.sym.Convolution(x, kernel=(1, 1), num_filter=64, no_bias=True, name="c1")
    c2 = mx.sym.Convolution(c1, kernel=(3, 3), pad=(1, 1), num_filter=64, no_bias=True, name="c2")
    c3 = mx.sym.Convolution(mx.sym.var("unknown"), kernel=(1, 1), num_filter=64, name="c3")
    casts = _graph_casts(mx.sym.Group([c2, c3]))
    assert casts["c1"] == "float32", "1x1 on 6x6x64 must stay float32 under AMX: %s" % casts
    assert casts["c2"] == "bfloat16", "a 3x3 convolution keeps bfloat16: %s" % casts
    assert casts["c3"] == "float32", "unknown shapes count as the guarded ones: %s" % casts

    # A hybridized block sees its real input shapes while its graph is built: the guarded
    # convolutions run (in float32, so on any CPU) and give float32's values, inside record().
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(64, 1, in_channels=64, use_bias=False),
            mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Conv2D(32, 1, in_channels=64, use_bias=False))
    net.initialize(mx.init.Xavier(rnd_type="gaussian"))
    x = mx.nd.array(np.random.RandomState(0).randn(*GUARDED))
    with amp.disabled():
        want = net(x).asnumpy()
    net.hybridize()
    x.attach_grad()
    with mx.autograd.record():
        out = net(x).astype("float32")
    out.backward()
    assert out.dtype == np.float32 and np.array_equal(out.asnumpy(), want), (
        "guarded convolutions must compute float32's values exactly")
    assert np.isfinite(x.grad.asnumpy()).all()


def test_amx_guard_in_convert_and_cast_model(forced_class):
    """Checks decisions only (class 'amx' forced by ``forced_class``; runs float32 only)."""
    forced_class("amx")
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(64, 1, in_channels=64, use_bias=False),
            mx.gluon.nn.Conv2D(64, 3, padding=1, in_channels=64, use_bias=False))
    net.initialize()
    net.hybridize()
    lp = amp.convert_hybrid_block(net, "bfloat16", example_inputs=mx.nd.ones(GUARDED))
    casts = _graph_casts(lp(mx.sym.var("data")))
    conv0, conv1 = _in_layer_order(n for n in casts if n.endswith("fwd"))
    assert casts[conv0] == "float32" and casts[conv1] == "bfloat16", casts

    o2 = mx.gluon.nn.HybridSequential()
    o2.add(mx.gluon.nn.Conv2D(64, 1, in_channels=64, use_bias=False),
           mx.gluon.nn.Conv2D(32, 1, in_channels=64, use_bias=False))
    o2.initialize(mx.init.Xavier())
    x = mx.nd.array(np.random.RandomState(1).rand(*GUARDED))
    want = o2(x).asnumpy()
    amp.cast_model(o2, "bfloat16")
    for hybridize in (False, True):
        if hybridize:
            o2.hybridize()
        with mx.autograd.record():
            out = o2(x)
        out.backward()
        rel = np.abs(out.asnumpy() - want).max() / np.abs(want).max()
        # bfloat16 weights, float32 compute: only the weights' rounding remains. Measured on
        # Zen 4: 0.0031 here, alike with no cap, AVX512_CORE and AVX2 caps (float32 compute);
        # 0.0033-0.0057 over 30 MXNet seeds of the (unseeded) Xavier init. 2e-2: 3.5x above.
        assert out.dtype == np.float32 and rel < 2e-2, (hybridize, rel)


@pytest.mark.parametrize("shape, guarded", [((1, 64, 7, 7), False), ((1, 64, 6, 6), True)],
                         ids=["resnet50-last-stage-49px", "family-36px"])
def test_convert_guards_by_the_shapes_of_the_blocks_last_call(forced_class, caplog, shape,
                                                              guarded):
    """A block that ran (under mxamp's block hook) converts without example_inputs: the guard
    reads the shapes of that call, so ResNet-50's 7x7 stage keeps bfloat16 on AMX (before,
    unknown shapes sent every 1x1 convolution to float32: 1.19x instead of ~2.75x).
    Checks decisions only (class 'amx' forced by ``forced_class``; the block runs float32)."""
    forced_class("amx")
    from mxamp.runtime.hooks import hook_block_graphs
    hook_block_graphs()
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(64, 1, in_channels=64, use_bias=False))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones(shape))
    with caplog.at_level("WARNING", logger="mxamp"):
        lp = amp.convert_hybrid_block(net, "bfloat16")
    casts = _graph_casts(lp(mx.sym.var("data")))
    (conv,) = [n for n in casts if n.endswith("fwd")]
    assert casts[conv] == ("float32" if guarded else "bfloat16"), (shape, casts)
    assert not [r for r in caplog.records if "does not know the input shapes" in r.message]
    net.__dict__.pop("_mxamp_input_shapes")      # as if it ran before mxamp was imported
    with caplog.at_level("WARNING", logger="mxamp"):
        lp = amp.convert_hybrid_block(net, "bfloat16")
    casts = _graph_casts(lp(mx.sym.var("data")))
    assert casts[conv] == "float32", "unknown shapes: the guard holds"
    assert [r for r in caplog.records if "example_inputs=" in r.message], "and it says why"


def test_amx_guard_in_numpy_interface_calls(forced_class):
    """Checks decisions only (class 'amx' forced by ``forced_class``; runs float32 only)."""
    forced_class("amx")
    amp.init("bfloat16")
    rng = np.random.RandomState(2)
    x = mx.np.array(rng.randn(*GUARDED).astype("float32"))
    w = mx.np.array(rng.randn(64, 64, 1, 1).astype("float32") * 0.1)
    x.attach_grad()
    with mx.autograd.record():
        y = mx.npx.convolution(x, w, kernel=(1, 1), num_filter=64, no_bias=True)
        loss = (y.astype("float32") ** 2).sum()
    loss.backward()
    with amp.disabled():
        want = mx.npx.convolution(x, w, kernel=(1, 1), num_filter=64, no_bias=True)
    assert y.dtype == np.float32 and np.array_equal(y.asnumpy(), want.asnumpy()), (
        "a guarded mx.npx convolution computes float32's values")
    assert amp.precision_of("_npx_convolution", data_shape=FREE, kernel=(1, 1))[0] == "bfloat16"


def test_shape_conditions_in_convert_with_symbol_api_names(forced_class):
    """Symbol-API graphs name parameters after their node ('stem_weight'): the data input
    is still found, so a shape condition holds where it should. Checks decisions only (class
    'native' forced by ``forced_class``)."""
    forced_class("native")
    x = mx.sym.var("data")
    stem = mx.sym.Convolution(x, kernel=(3, 3), num_filter=16, name="stem")
    body = mx.sym.Convolution(stem, kernel=(3, 3), num_filter=16, name="body")
    from mxamp.conversion.precision_pass import conditional_fp32_nodes
    from mxamp.precision.resolve import lists_for
    lists = lists_for("bfloat16", conditional_fp32_ops=[("Convolution", "in_channels", ["<=4"])])
    assert conditional_fp32_nodes(body, lists, {"data": (2, 3, 16, 16)}) == {"stem"}
    assert conditional_fp32_nodes(body, lists, {}) == set(), (
        "unknown shapes leave a speed rule off")
