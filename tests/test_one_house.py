"""One registry, one exception type, one configuration, the reference's whole surface.

* An operator alias means the same thing at every entry point: each one called with an alias
  and with the canonical name builds the same graph, and not the default one.
* Every entry point raises one exception type for a bad argument: ``AmpArgumentError``, a
  ``ValueError`` and an ``AssertionError`` (the reference's), and a ``TypeError`` (0.1.0's).
* ``init_trainer`` shows its defaults in its signature; the scaler's state is versioned and
  mxamp 0.1.0's format loads.
* ``amp.lists.symbol_fp16`` / ``symbol_bf16`` have the reference's lists, and editing them
  before ``init`` (or passing them to ``convert_*``) has the reference's effect.
"""
import inspect
import json
import os

import mxnet as mx
import numpy as np
import pytest

import mxamp
from mxamp import amp, dtypes
from mxamp.errors import AmpArgumentError
from mxamp.backend.graphs import cast_nodes, graph_nodes
from mxamp.training.scaler import DEFAULTS, STATE_VERSION, LossScaler
from bf16_expect import BF16_KERNELS, where

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------- one registry
def small_symbol():
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc1")
    flat = mx.sym.Flatten(mx.sym.Activation(fc, act_type="relu", name="act"), name="flat")
    return mx.sym.FullyConnected(flat, num_hidden=2, name="fc2")


def graph_key(sym):
    """What a graph computes, node names aside: (op, dtype attribute) in order."""
    return [(n["op"], n.get("attrs", {}).get("dtype")) for n in graph_nodes(sym)]


def _gluon_twin():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, activation="relu"), mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dense(2))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((1, 4)))
    return net


def _bucketing_twin():
    def sym_gen(key):
        return small_symbol(), ("data",), None
    mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=4)
    mod.bind(data_shapes=[("data", (1, 4))], for_training=False)
    mod.init_params()
    return mod


#: Entry points that build the graph asked for on every CPU class; the others build what the
#: CPU computes, float32 on class 'none' (bfloat16 requests compute float32 there), where an
#: op moved to fp32_ops changes nothing.
GRAPH_ONLY = ("convert_symbol float16", "convert_symbol bfloat16", "convert_model float16")


def _entry_point_keys(fp32_ops, net, mod):
    """What each entry point builds from small_symbol() (or its Gluon and bucketing twins)."""
    kw = {} if fp32_ops is None else {"fp32_ops": fp32_ops}
    sym = small_symbol()
    args = {"fc1_weight": mx.nd.ones((8, 4)), "fc1_bias": mx.nd.zeros((8,)),
            "fc2_weight": mx.nd.ones((2, 8)), "fc2_bias": mx.nd.zeros((2,))}
    return {
        "convert_symbol float16": graph_key(amp.convert_symbol(sym, "float16", **kw)),
        "convert_symbol bfloat16": graph_key(amp.convert_symbol(sym, "bfloat16", **kw)),
        "convert_model float16": graph_key(amp.convert_model(sym, args, {}, "float16", **kw)[0]),
        "convert_hybrid_block": graph_key(
            amp.convert_hybrid_block(net, "bfloat16", **kw)._cached_graph[1]),
        "accuracy_report": amp.accuracy_report(net, mx.nd.ones((1, 4)), "bfloat16",
                                               **kw).op_dtypes,
        "convert_bucketing_module": graph_key(
            amp.convert_bucketing_module(mod, "bfloat16", **kw)._buckets[4].symbol)}


@pytest.mark.cpu_class
@pytest.mark.parametrize("alias, canonical", [("flatten", "Flatten"),
                                              ("_npx_fully_connected", "FullyConnected")])
def test_an_alias_means_the_same_at_every_entry_point(alias, canonical, amp_off):
    net, mod = _gluon_twin(), _bucketing_twin()
    by_alias, by_canonical, default = (_entry_point_keys(ops, net, mod)
                                       for ops in ([alias], [canonical], None))
    assert sorted(default) == sorted(GRAPH_ONLY + ("convert_hybrid_block", "accuracy_report",
                                                   "convert_bucketing_module"))
    for entry in sorted(default):
        assert by_alias[entry] == by_canonical[entry], (
            "%s: fp32_ops=[%r] differs from [%r]" % (entry, alias, canonical))
        moves = BF16_KERNELS or entry in GRAPH_ONLY
        assert (by_canonical[entry] != default[entry]) == moves, (
            "%s: fp32_ops=[%r] %s the default graph %s" % (
                entry, canonical, "must change" if moves else "cannot change", where()))
    patched = []
    for name in (None, alias, canonical):
        amp.init("bfloat16", fp32_ops=[name] if name else None)
        patched.append(amp.op_lists().category(canonical))
        if name:
            assert amp.op_lists().category(alias) == "fp32", "init moved %s's aliases too" % name
        amp.reset()
    assert patched[0] != "fp32" and patched[1:] == ["fp32", "fp32"], "amp.init: %s" % patched


def test_the_0_1_0_alias_bug_is_gone():
    """convert_symbol(fp32_ops=['flatten']) was ignored in 0.1.0 (two registries)."""
    sym = mx.sym.Flatten(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc"),
                         name="flat")
    for name in ("Flatten", "flatten"):
        lp = amp.convert_symbol(sym, "float16", fp32_ops=[name], fp32_outputs=False)
        inputs = [n for n in graph_nodes(lp) if n["op"] == "amp_cast" and
                  n["attrs"]["dtype"] == "float32"]
        assert inputs, "fp32_ops=[%r]: Flatten must get a float32 cast of the fp16 FC" % name


# ------------------------------------------------------------------- one exception type
def _sym():
    return mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name="fc")


ARGUMENT_ERRORS = {
    "init target": lambda: amp.init("int8"),
    "init unknown op": lambda: amp.init("bfloat16", fp32_ops=["NotAnOp"]),
    "init op in two lists": lambda: amp.init("bfloat16", target_precision_ops=["softmax"],
                                             fp32_ops=["softmax"]),
    "init_trainer option": lambda: amp.init_trainer(
        mx.gluon.Trainer([_param()], "sgd", kvstore=None), growth_factor=0.5),
    "init_trainer keyword": lambda: amp.init_trainer(
        mx.gluon.Trainer([_param()], "sgd", kvstore=None), loss_scale=1.0),
    "init_trainer object": lambda: amp.init_trainer(object()),
    "scale_loss loss": lambda: amp.scale_loss(object(), object()).__enter__(),
    "convert_symbol op in two lists": lambda: amp.convert_symbol(
        _sym(), "float16", target_dtype_ops=["FullyConnected"], fp32_ops=["FullyConnected"]),
    "convert_symbol list type": lambda: amp.convert_symbol(_sym(), "float16", fp32_ops="fc"),
    "convert_symbol unknown op": lambda: amp.convert_symbol(_sym(), "float16",
                                                            fp32_ops=["Conv2DTypo"]),
    "convert_model params": lambda: amp.convert_model(_sym(), [], {}, "bfloat16"),
    "convert_hybrid_block object": lambda: amp.convert_hybrid_block(_sym(), "bfloat16"),
    "convert_bucketing_module object": lambda: amp.convert_bucketing_module(_sym()),
    "cast_model object": lambda: amp.cast_model(_sym(), "bfloat16"),
    "cast_model target": lambda: amp.cast_model(mx.gluon.nn.Dense(2), "int8"),
    "list_fp32_ops target": lambda: amp.list_fp32_ops("float64"),
    "precision_plan target": lambda: amp.precision_plan("int8"),
    "LossScaler state": lambda: LossScaler().load_state_dict({"bogus": 1}),
}


def _param():
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize()
    return p


@pytest.mark.parametrize("case", sorted(ARGUMENT_ERRORS))
def test_every_entry_point_raises_the_one_argument_error(case, amp_off):
    with pytest.raises(AmpArgumentError) as err:
        ARGUMENT_ERRORS[case]()
    assert isinstance(err.value, ValueError) and isinstance(err.value, AssertionError), \
        "an argument error is both a ValueError and (as in the reference) an AssertionError"
    assert str(err.value), "the message names the problem"
    assert not amp.is_initialized(), "a bad argument leaves AMP off"


def test_code_catching_the_reference_assertion_keeps_working():
    try:
        amp.convert_symbol(_sym(), "float16", target_dtype_ops=["FullyConnected"],
                           fp32_ops=["FullyConnected"])
    except AssertionError as err:   # what a script written for mxnet.contrib.amp catches
        assert "both" in str(err)
    else:
        pytest.fail("an op in two lists must raise")


# ------------------------------------------------------------------- init_trainer, state
def test_init_trainer_defaults_are_in_its_signature():
    params = inspect.signature(amp.init_trainer).parameters
    shown = {name: p.default for name, p in params.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert shown == {"target_dtype": None, "init_scale": None, "dynamic": None,
                     "growth_factor": DEFAULTS.growth_factor,
                     "growth_interval": DEFAULTS.growth_interval,
                     "backoff_factor": DEFAULTS.backoff_factor, "min_scale": DEFAULTS.min_scale,
                     "max_scale": DEFAULTS.max_scale, "hysteresis": DEFAULTS.hysteresis,
                     "skip_nonfinite": True}, shown
    assert (DEFAULTS.growth_factor, DEFAULTS.growth_interval, DEFAULTS.max_scale) == \
        (2.0, 2000, 2.0 ** 24), "the documented float16 defaults"
    assert inspect.signature(LossScaler).parameters["growth_interval"].default == 2000


def test_readme_scaler_table_matches_the_defaults():
    text = open(os.path.join(ROOT, "README.md")).read()
    for needle in ("| `growth_factor` / `growth_interval` | %r / %d |"
                   % (DEFAULTS.growth_factor, DEFAULTS.growth_interval),
                   "| `backoff_factor` | %r |" % DEFAULTS.backoff_factor,
                   "| `min_scale` / `max_scale` | %r / 2**%d |"
                   % (DEFAULTS.min_scale, int(np.log2(DEFAULTS.max_scale))),
                   "| `hysteresis` | %d |" % DEFAULTS.hysteresis):
        assert needle in text, "README's loss-scaler table disagrees with the code: %s" % needle


#: What mxamp 0.1.0's LossScaler(init_scale=64.0, growth_interval=5).state_dict() gave after
#: update(False), update(True), update(False), as json stores it: its 13 keys, no 'version'
#: (produced by mxamp/scaler.py at 0611878^, the last 0.1.0 commit before the versioned state).
OLD_STATE = {"scale": 32.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5,
             "min_scale": 1.0, "max_scale": 16777216.0, "hysteresis": 1, "dynamic": True,
             "clean_steps": 1, "overflows_since_change": 0, "steps": 3, "skipped_steps": 1,
             "history": [[2, 32.0, "overflow"]]}


def test_scaler_state_is_versioned_and_loads_the_0_1_0_format():
    scaler = LossScaler(init_scale=64.0, growth_interval=5)
    for clean in (False, True, False):
        scaler.update(clean)
    state = scaler.state_dict()
    assert state["version"] == STATE_VERSION == 1
    assert {k: v for k, v in state.items() if k != "version"} == dict(
        OLD_STATE, history=[(2, 32.0, "overflow")]), "today's keys are 0.1.0's and 'version'"
    loaded = LossScaler()
    loaded.load_state_dict(json.loads(json.dumps(OLD_STATE)))    # as a checkpoint stores it
    assert (loaded.scale, loaded.growth_interval, loaded.steps, loaded.skipped_steps,
            loaded.clean_steps, list(loaded.history)) == (32.0, 5, 3, 1, 1, [(2, 32.0, "overflow")])
    for _ in range(4):      # 1 clean step loaded + 4 = growth_interval: the scale doubles
        loaded.update(False)
    assert loaded.scale == 64.0 and loaded.state_dict()["version"] == STATE_VERSION
    minimal = LossScaler()
    minimal.load_state_dict({"scale": 8.0, "version": 1})        # keys added later default
    assert (minimal.scale, minimal.growth_interval) == (8.0, DEFAULTS.growth_interval)
    with pytest.raises(AmpArgumentError, match="newer mxamp"):
        LossScaler().load_state_dict(dict(state, version=STATE_VERSION + 1))


# ------------------------------------------------------------------- the reference's lists
REFERENCE_NAMES = {
    "symbol_fp16": ("FP16_FUNCS", "FP16_FP32_FUNCS", "FP32_FUNCS", "CONDITIONAL_FP32_FUNCS",
                    "WIDEST_TYPE_CASTS", "LOSS_OUTPUT_FUNCTIONS"),
    "symbol_bf16": ("BF16_FUNCS", "BF16_FP32_FUNCS", "BF16_USE_FP32_PARAMS", "FP32_FUNCS",
                    "CONDITIONAL_FP32_FUNCS", "WIDEST_TYPE_CASTS", "LOSS_OUTPUT_FUNCTIONS"),
}


@pytest.mark.parametrize("module", sorted(REFERENCE_NAMES))
def test_reference_lists_exist_with_the_reference_names(module):
    import importlib
    reference = importlib.import_module("mxnet.contrib.amp.lists." + module)
    for facade in (amp, mxamp):              # from mxamp import amp / import mxamp as amp
        ours = getattr(facade.lists, module)
        for name in REFERENCE_NAMES[module]:
            assert type(getattr(ours, name)) is type(getattr(reference, name)), (module, name)
    ours = getattr(amp.lists, module)
    target = "float16" if module == "symbol_fp16" else "bfloat16"
    low = "FP16_FUNCS" if target == "float16" else "BF16_FUNCS"
    assert getattr(ours, low) == amp.list_lp16_ops(target)
    assert ours.FP32_FUNCS == amp.list_fp32_ops(target)
    assert ours.CONDITIONAL_FP32_FUNCS == amp.list_conditional_fp32_ops(target)


def test_appending_to_a_reference_list_before_init_takes_effect(amp_off):
    fp32_funcs = amp.lists.symbol_bf16.FP32_FUNCS
    fp32_funcs.append("Flatten")
    try:
        amp.init("bfloat16")
        x = mx.nd.amp_cast(mx.nd.ones((2, 2)), dtype=dtypes.BFLOAT16)
        assert mx.nd.Flatten(x).dtype == np.float32, "Flatten appended to FP32_FUNCS: float32"
        assert amp.op_lists().category("_npx_batch_flatten") == "fp32", "and so do its aliases"
    finally:
        fp32_funcs.remove("Flatten")
        amp.reset()
    amp.init("bfloat16")
    x = mx.nd.amp_cast(mx.nd.ones((2, 2)), dtype=dtypes.BFLOAT16)
    assert mx.nd.Flatten(x).dtype == dtypes.BFLOAT16, "the list restored: Flatten is neutral"


def test_reference_lists_passed_to_convert_symbol_give_the_default_graph():
    lists = amp.lists.symbol_fp16
    sym = small_symbol()
    explicit = amp.convert_symbol(sym, "float16", target_dtype_ops=lists.FP16_FUNCS,
                                  fp32_ops=lists.FP32_FUNCS,
                                  conditional_fp32_ops=lists.CONDITIONAL_FP32_FUNCS)
    assert graph_key(explicit) == graph_key(amp.convert_symbol(sym, "float16"))
    lists.FP32_FUNCS.append("FullyConnected")      # edited module lists are the defaults
    try:
        moved = amp.convert_symbol(sym, "float16")
        assert not [c for c in cast_nodes(moved) if c["attrs"]["dtype"] == "float16"], \
            "FullyConnected appended to FP32_FUNCS: nothing is cast to float16"
    finally:
        lists.FP32_FUNCS.remove("FullyConnected")
