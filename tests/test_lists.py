"""Op lists: every registered operator is classified, the tables are consistent, and the facts
they encode hold on the real MXNet 1.9.1 build (kernels are run, in subprocesses, to check).

"Backward" in these tests means a pure-backward helper: an operator whose name has ``backward``
as one of its underscore-separated words (``_backward_FullyConnected``, ``_split_v2_backward``,
``_contrib_backward_quadratic``, ``_npi_hsplit_backward``...). They follow their forward op and
are not listed; every other registered name is a forward op and must be classified.
"""
import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mxnet as mx

from bf16_expect import CPU_CLASS, where
from side_by_side import map_side_by_side
from mxamp import amp
from mxamp.backend.cpu import BF16_CLASSES
from mxamp.lists import bfloat16 as bf16_data
from mxamp.lists import float16 as fp16_data
from mxamp.lists import get_op_lists
from mxamp.backend.registry import op_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("float16", "bfloat16")
DATA = {"float16": fp16_data, "bfloat16": bf16_data}
TABLES = ("LOW_PRECISION", "FP32", "WIDEST", "NEUTRAL", "CONDITIONAL_FP32")
#: Category name used by OpLists for each data table.
CATEGORY_OF_TABLE = dict(zip(TABLES, ("low_precision", "fp32", "widest", "neutral",
                                      "conditional_fp32")))


def is_backward(name):
    return "backward" in name.split("_")


@functools.lru_cache(maxsize=None)
def registry():
    """{registered name: (op handle, canonical name, {argument name: type string})}."""
    ops = {}
    for name in mx.operator.get_all_registered_operators():
        info = op_info(name)
        ops[name] = (info.handle, info.canonical, dict(info.arguments))
    return ops


def forward_names():
    return {name for name in registry() if not is_backward(name)}


def alias_groups():
    """Forward op handle -> set of all its registered names."""
    groups = {}
    for name in forward_names():
        groups.setdefault(registry()[name][0], set()).add(name)
    return groups


def table_names(data):
    return {table: set(getattr(data, table)) for table in TABLES}


# ------------------------------------------------------------------ coverage and consistency
def test_registry_is_the_one_the_lists_were_made_for():
    names = set(registry())
    backward = names - forward_names()
    assert len(names) == 1167, "lists were made for libmxnet 1.9.1's 1167 operator names"
    assert len(backward) == 275 and len(alias_groups()) == 611, (
        "expected 275 backward helpers and 611 forward ops, got %d and %d"
        % (len(backward), len(alias_groups())))
    assert {"_backward_FullyConnected", "_split_v2_backward", "_contrib_backward_quadratic",
            "_npi_hsplit_backward", "_broadcast_backward"} <= backward
    forward_handles = {registry()[n][0] for n in forward_names()}
    hidden = sorted(n for n in backward if registry()[n][0] in forward_handles)
    assert not hidden, "these 'backward' names alias a forward op and must be listed: %s" % hidden


@pytest.mark.parametrize("target", TARGETS)
def test_every_forward_op_is_classified(target):
    missing = sorted(forward_names() - get_op_lists(target).all_ops(), key=str.lower)
    assert not missing, "%d forward ops are in no %s list: %s" % (len(missing), target, missing)


@pytest.mark.parametrize("target", TARGETS)
def test_lists_name_only_registered_forward_ops(target):
    data = DATA[target]
    named = set().union(*table_names(data).values(), data.LOSS_OUTPUT, data.FP32_PARAMS,
                        data.NO_CPU_KERNEL)
    unknown = sorted(named - set(registry()))
    backward = sorted(n for n in named if is_backward(n))
    assert not unknown, "%s lists name ops that do not exist: %s" % (target, unknown)
    assert not backward, "%s lists name backward helpers: %s" % (target, backward)


@pytest.mark.parametrize("target", TARGETS)
def test_no_op_is_in_two_categories(target):
    tables = table_names(DATA[target])
    clashes = {(a, b): sorted(tables[a] & tables[b])
               for i, a in enumerate(TABLES) for b in TABLES[i + 1:] if tables[a] & tables[b]}
    assert not clashes, "%s ops in two categories: %s" % (target, clashes)


@pytest.mark.parametrize("target", TARGETS)
def test_aliases_share_one_category_and_condition(target):
    lists = get_op_lists(target)
    disagree = []
    for names in alias_groups().values():
        categories = {n: lists.category(n) for n in names}
        conditions = {lists.conditional_fp32.get(n) for n in names}
        if len(set(categories.values())) > 1 or len(conditions) > 1:
            disagree.append(categories)
    assert not disagree, "%s aliases of one op disagree: %s" % (target, disagree)


@pytest.mark.parametrize("target", TARGETS)
def test_reasons_and_conditions_are_well_formed(target):
    data = DATA[target]
    for table in TABLES[:-1]:
        bad = {k: v for k, v in getattr(data, table).items() if not isinstance(v, str)}
        assert not bad, "%s.%s values must be reason strings: %s" % (target, table, bad)
    for op, entry in data.CONDITIONAL_FP32.items():
        param, values, reason = entry
        arg_type = registry()[op][2].get(param, "")
        assert arg_type, "%s: %s has no parameter %r" % (target, op, param)
        unknown = [v for v in values if "'%s'" % v not in arg_type]
        assert not unknown and reason, (
            "%s: %s(%s=...) values %s are not among %s, or the reason is empty"
            % (target, op, param, unknown, arg_type))


@pytest.mark.parametrize("target", TARGETS)
def test_loss_outputs_are_the_fp32_ops_with_grad_scale(target):
    data = DATA[target]
    with_grad_scale = {n for n in forward_names() if "grad_scale" in registry()[n][2]}
    assert set(data.LOSS_OUTPUT) == with_grad_scale, (
        "LOSS_OUTPUT must be exactly the ops whose grad_scale the loss scale multiplies; "
        "differs by %s" % sorted(set(data.LOSS_OUTPUT) ^ with_grad_scale))
    assert set(data.LOSS_OUTPUT) <= set(data.FP32), "loss outputs must run in float32"


@pytest.mark.parametrize("target", TARGETS)
def test_fp32_params_and_no_cpu_kernel_tables(target):
    data = DATA[target]
    for op, inputs in data.FP32_PARAMS.items():
        unknown = set(inputs) - set(registry()[op][2])
        assert not unknown, "%s FP32_PARAMS[%s] names no input of the op: %s" % (
            target, op, unknown)
    assert set(data.NO_CPU_KERNEL) <= set(data.LOW_PRECISION), (
        "NO_CPU_KERNEL qualifies low-precision ops only: %s"
        % sorted(set(data.NO_CPU_KERNEL) - set(data.LOW_PRECISION)))
    for cpu_class, ops in data.NO_KERNEL_BY_CPU_CLASS.items():
        assert cpu_class in BF16_CLASSES, "%s: unknown CPU class %r" % (target, cpu_class)
        unknown = sorted(set(ops) - forward_names())
        assert not unknown, "%s/%s: not registered forward ops: %s" % (target, cpu_class, unknown)
        handles = {registry()[op][0] for op in ops}
        partial = sorted(n for h in handles for n in alias_groups()[h] if n not in ops)
        assert not partial, "%s/%s lists an op without its aliases %s" % (target, cpu_class,
                                                                          partial)


def test_bf16_cpu_class_table_names_every_onednn_op_on_none_only():
    """oneDNN 2.4 has no bfloat16 kernel below avx512_core: every oneDNN op lacks one on 'none'
    CPUs, and the other classes lack none (ci/probe_bf16_kernels.py on AVX2 and AVX-512)."""
    lists = get_op_lists("bfloat16")
    onednn = {"Convolution", "Deconvolution", "FullyConnected", "BatchNorm", "Pooling",
              "Activation", "LeakyReLU", "_contrib_BatchNormWithReLU", "_sg_mkldnn_conv",
              "_sg_mkldnn_fully_connected"}
    assert onednn <= lists.missing_kernels("none"), sorted(onednn - lists.missing_kernels("none"))
    assert lists.low_precision <= lists.missing_kernels("none"), \
        "every default bf16 low-precision op is a oneDNN op"
    for cpu_class in ("emulated", "native", "amx"):
        assert not lists.missing_kernels(cpu_class), cpu_class
    assert not get_op_lists("float16").no_kernel_by_cpu_class, "float16 is per target, not class"


# ------------------------------------------------------------------ facts the lists encode
FACTS = [
    # (target, op, category, why)
    ("float16", "Concat", "widest", "multi-input ops take the widest input type"),
    ("bfloat16", "Concat", "widest", "reference bug: 'Non-uniform data type in Concat'"),
    ("bfloat16", "concat", "widest", "alias of Concat"),
    ("bfloat16", "add_n", "widest", ""), ("bfloat16", "_npi_concatenate", "widest", ""),
    ("float16", "_zeros", "neutral", "no tensor input: reference crashes hybridized blocks"),
    ("bfloat16", "_zeros", "neutral", ""), ("bfloat16", "_arange", "neutral", ""),
    ("bfloat16", "_random_uniform", "neutral", ""), ("float16", "_npi_zeros", "neutral", ""),
    ("float16", "dot", "low_precision", "GPU GEMM"),
    ("float16", "batch_dot", "low_precision", "GPU GEMM"),
    ("bfloat16", "dot", "fp32", "only supports float32/float64 for CPU"),
    ("bfloat16", "batch_dot", "fp32", ""), ("bfloat16", "_npi_matmul", "fp32", ""),
    ("float16", "_npi_matmul", "low_precision", ""),
    ("bfloat16", "_linalg_gemm2", "fp32", "la_op is float32/float64 only"),
    ("float16", "Convolution", "low_precision", ""),
    ("bfloat16", "Convolution", "low_precision", "oneDNN bf16 kernel"),
    ("float16", "FullyConnected", "low_precision", ""),
    ("bfloat16", "FullyConnected", "low_precision", ""),
    ("bfloat16", "Deconvolution", "low_precision", "oneDNN bf16 kernel (probed)"),
    ("bfloat16", "RNN", "fp32", "Unknown type enum 12"), ("float16", "RNN", "low_precision", ""),
    ("float16", "softmax", "fp32", ""), ("bfloat16", "softmax", "fp32", ""),
    ("bfloat16", "LayerNorm", "fp32", "no bf16 CPU kernel"), ("float16", "LayerNorm", "fp32", ""),
    ("bfloat16", "BatchNorm", "neutral", "bf16 data beside fp32 statistics"),
    ("float16", "BatchNorm", "neutral", ""), ("bfloat16", "Flatten", "neutral", ""),
    ("bfloat16", "Dropout", "fp32", "Unknown type enum 12"), ("float16", "Dropout", "neutral", ""),
    ("bfloat16", "transpose", "fp32", "bf16 transpose corrupts the heap"),
    ("bfloat16", "_np_transpose", "neutral", "its own kernel works"),
    ("float16", "sgd_update", "neutral", "AMP never touches optimizer updates"),
    ("float16", "mp_sgd_update", "neutral", "takes fp16 weights beside fp32 masters"),
    ("bfloat16", "multi_all_finite", "neutral", ""), ("bfloat16", "amp_cast", "neutral", ""),
    ("bfloat16", "Cast", "neutral", ""), ("float16", "_contrib_quantized_conv", "neutral", ""),
    ("float16", "exp", "fp32", ""), ("float16", "_npi_exp", "fp32", ""),
    ("float16", "square", "fp32", "overflows fp16"), ("bfloat16", "square", "neutral", "range"),
    ("float16", "sum", "fp32", ""), ("bfloat16", "_np_sum", "fp32", ""),
    ("float16", "SoftmaxOutput", "fp32", ""), ("float16", "_image_normalize", "neutral", ""),
    ("float16", "Custom", "fp32", "user code assumes float32"),
    ("float16", "_CustomFunction", "neutral", ""), ("float16", "_sg_mkldnn_conv", "neutral", ""),
    ("float16", "Activation", "conditional_fp32", "softrelu"),
    ("bfloat16", "Pooling", "conditional_fp32", "sum/lp pooling have no bf16 kernel"),
]
FACTS += [(t, op, "low_precision", "attention matmul") for t in ("float16",) for op in (
    "_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt",
    "_contrib_interleaved_matmul_encdec_qk", "_contrib_interleaved_matmul_encdec_valatt")]
FACTS += [("bfloat16", op, "fp32", "Only FP32 is supported on CPU") for op in (
    "_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt",
    "_contrib_interleaved_matmul_encdec_qk", "_contrib_interleaved_matmul_encdec_valatt")]


@pytest.mark.parametrize("target,op,category,why", FACTS)
def test_documented_fact(target, op, category, why):
    got = get_op_lists(target).category(op)
    assert got == category, "%s: %s should be %s (%s), is %s" % (target, op, category, why, got)


#: Legacy ops whose tensor inputs are not in their signature (they are real layers).
LEGACY_HIDDEN_INPUTS = {"_contrib_PSROIPooling", "_contrib_DeformablePSROIPooling", "Crop"}


@pytest.mark.parametrize("target", TARGETS)
def test_ops_without_tensor_inputs_are_neutral(target):
    """The reference puts _zeros/_arange/random_* in fp32 and crashes hybridized blocks."""
    no_inputs = {n for n in forward_names()
                 if not any(t.startswith("NDArray") for t in registry()[n][2].values())
                 and registry()[n][1] not in LEGACY_HIDDEN_INPUTS}
    assert len(no_inputs) > 40, "expected the creation and sampler ops, got %s" % no_inputs
    lists = get_op_lists(target)
    wrong = sorted(n for n in no_inputs if lists.category(n) != "neutral")
    assert not wrong, "%s: ops with no tensor input must be neutral: %s" % (target, wrong)


def test_float16_cpu_fallback_table():
    lists = get_op_lists("float16")
    for op in ("Convolution", "FullyConnected", "dot", "batch_dot", "_npx_batch_dot", "RNN",
               "_contrib_interleaved_matmul_selfatt_qk", "_npi_matmul"):
        assert op in lists.no_cpu_kernel, "%s has no fp16 CPU kernel: keep it fp32 on CPU" % op
    assert "_npi_einsum" not in lists.no_cpu_kernel, "einsum has an fp16 CPU kernel (probed)"
    assert not get_op_lists("bfloat16").no_cpu_kernel, "every bf16 low-precision op has a kernel"


def test_conditions_per_target():
    assert get_op_lists("float16").conditional_fp32["Activation"] == ("act_type", ("softrelu",))
    assert get_op_lists("bfloat16").conditional_fp32["_npx_activation"] == (
        "act_type", ("softsign",)), "bf16: only softsign lacks a kernel; the alias must agree"
    assert "prelu" in get_op_lists("bfloat16").conditional_fp32["LeakyReLU"][1]


# ------------------------------------------------------------------ public list functions
LIST_FUNCTIONS = ("list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops",
                  "list_widest_type_cast", "list_loss_output_functions")


@pytest.mark.parametrize("target", TARGETS)
def test_list_functions_return_the_data(target):
    data = DATA[target]
    assert amp.list_lp16_ops(target) == sorted(data.LOW_PRECISION)
    assert amp.list_fp32_ops(target) == sorted(data.FP32)
    assert amp.list_lp16_fp32_ops(target) == sorted(data.NEUTRAL)
    assert amp.list_widest_type_cast(target) == sorted(data.WIDEST)
    assert amp.list_loss_output_functions(target) == sorted(data.LOSS_OUTPUT)
    conditional = sorted(data.CONDITIONAL_FP32.items())
    assert amp.list_conditional_fp32_ops(target) == [
        (op, param, list(values)) for op, (param, values, _) in conditional]
    assert amp.list_lp16_use_fp32_params(target) == {
        op: list(names) for op, names in data.FP32_PARAMS.items()}


@pytest.mark.parametrize("target", TARGETS)
def test_list_functions_have_the_reference_shapes(target):
    from mxnet.contrib import amp as reference
    ref_target = target if target == "float16" else reference.amp.bfloat16
    for name in LIST_FUNCTIONS:
        ours, theirs = getattr(amp, name)(target), getattr(reference, name)(ref_target)
        assert isinstance(ours, list) and isinstance(theirs, list), name
        assert all(isinstance(op, str) for op in ours), "%s must list op names" % name
    ours = amp.list_conditional_fp32_ops(target)
    theirs = reference.list_conditional_fp32_ops(ref_target)
    for entries in (ours, theirs):
        assert all(isinstance(e, tuple) and len(e) == 3 and isinstance(e[2], list)
                   for e in entries), "conditional entries are (op, param, [values])"
    params = amp.list_lp16_use_fp32_params(target)
    assert isinstance(params, dict) and all(isinstance(v, list) for v in params.values())
    # Every op the reference classifies is classified here too (the reference is a subset).
    reference_ops = set().union(*(getattr(reference, n)(ref_target) for n in LIST_FUNCTIONS[:4]))
    reference_ops |= {e[0] for e in theirs}
    lost = sorted((reference_ops & forward_names()) - get_op_lists(target).all_ops())
    assert not lost, "ops the reference lists but mxamp does not: %s" % lost


@pytest.mark.parametrize("bad", ["float64", "int8", None, np.float32])
def test_bad_target_is_a_clear_value_error(bad):
    with pytest.raises(ValueError, match="float16|bfloat16"):
        amp.list_fp32_ops(bad)
    with pytest.raises(ValueError, match="float16.*bfloat16"):
        get_op_lists(str(bad))


def test_target_spellings_give_the_same_lists():
    assert amp.list_lp16_ops(np.float16) == amp.list_lp16_ops("float16")
    bf16_dtype = np.dtype([("bfloat16", np.uint16)])
    assert amp.list_lp16_ops(bf16_dtype) == amp.list_lp16_ops("bfloat16")


# ------------------------------------------------------------------ real kernels, in subprocesses
SMOKE_SCRIPT = r"""
import json
import numpy as np
import mxnet as mx
from mxnet import nd

BF16 = np.dtype([("bfloat16", np.uint16)])
rng = np.random.default_rng(0)


def rounded(*shape, low=-1.0, high=1.0):
    # float32 values that bf16 represents exactly: both runs see identical inputs
    x = nd.array(rng.uniform(low, high, shape).astype(np.float32))
    return nd.amp_cast(nd.amp_cast(x, dtype=BF16), dtype="float32")


x4, x2, y2, pos2 = rounded(2, 3, 8, 8), rounded(6, 8), rounded(6, 8), rounded(6, 8, low=0.5)
w_conv, w_deconv, w_fc, b4 = rounded(4, 3, 3, 3), rounded(3, 4, 3, 3), rounded(5, 8), rounded(4)
table = rounded(20, 16)
# BatchNorm's gamma, beta, moving mean and variance stay float32 beside bf16 data
stats = [nd.array(v) for v in ([1.0, 2.0, 0.5], [0.1, 0.0, -0.1], [0.0, 0.2, 0.1], [1, 0.5, 2])]
idx = nd.array([0, 3, 5, 1])
cond = nd.array(rng.integers(0, 2, (6, 8)).astype(np.float32))

# op name (as listed) -> (function, float inputs cast to bf16, float32 extras)
CASES = {
    "Convolution": (lambda x, w, b: nd.Convolution(x, w, b, kernel=(3, 3), num_filter=4),
                    [x4, w_conv, b4]),
    "Deconvolution": (lambda x, w: nd.Deconvolution(x, w, kernel=(3, 3), num_filter=4,
                                                    no_bias=True), [x4, w_deconv]),
    "FullyConnected": (lambda x, w: nd.FullyConnected(x, w, num_hidden=5, no_bias=True),
                       [x2, w_fc]),
    "Activation(relu)": (lambda x: nd.Activation(x, act_type="relu"), [x4]),
    "Activation(sigmoid)": (lambda x: nd.Activation(x, act_type="sigmoid"), [x4]),
    "Activation(tanh)": (lambda x: nd.Activation(x, act_type="tanh"), [x4]),
    "Activation(softrelu)": (lambda x: nd.Activation(x, act_type="softrelu"), [x4]),
    "LeakyReLU(leaky)": (lambda x: nd.LeakyReLU(x, act_type="leaky", slope=0.1), [x4]),
    "LeakyReLU(elu)": (lambda x: nd.LeakyReLU(x, act_type="elu"), [x4]),
    "LeakyReLU(gelu)": (lambda x: nd.LeakyReLU(x, act_type="gelu"), [x4]),
    "relu": (nd.relu, [x4]), "sigmoid": (nd.sigmoid, [x2]), "tanh": (nd.tanh, [x2]),
    "Pooling(max)": (lambda x: nd.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max"), [x4]),
    "Pooling(avg)": (lambda x: nd.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="avg"), [x4]),
    "BatchNorm": (lambda x: nd.BatchNorm(x, *stats, use_global_stats=True), [x4]),
    "Flatten": (nd.Flatten, [x4]), "Reshape": (lambda x: nd.reshape(x, shape=(0, -1)), [x4]),
    "expand_dims": (lambda x: nd.expand_dims(x, axis=1), [x2]),
    "SwapAxis": (lambda x: nd.swapaxes(x, 1, 2), [x4]),
    "slice": (lambda x: nd.slice(x, begin=(1, 2), end=(4, 7)), [x2]),
    "slice_axis": (lambda x: nd.slice_axis(x, axis=1, begin=2, end=6), [x2]),
    "SliceChannel": (lambda x: nd.split(x, num_outputs=2, axis=1)[1], [x2]),
    "take": (lambda x: nd.take(x, idx), [x2]),
    "Embedding": (lambda w: nd.Embedding(idx, w, input_dim=20, output_dim=16), [table]),
    "Concat": (lambda a, b: nd.concat(a, b, dim=1), [x2, y2]),
    "stack": (lambda a, b: nd.stack(a, b, axis=0), [x2, y2]),
    "add_n": (lambda a, b: nd.add_n(a, b), [x2, y2]),
    "elemwise_add": (nd.elemwise_add, [x2, y2]), "elemwise_mul": (nd.elemwise_mul, [x2, y2]),
    "broadcast_add": (nd.broadcast_add, [x2, y2]), "broadcast_sub": (nd.broadcast_sub, [x2, y2]),
    "broadcast_mul": (nd.broadcast_mul, [x2, y2]), "broadcast_div": (nd.broadcast_div, [x2, pos2]),
    "broadcast_maximum": (nd.broadcast_maximum, [x2, y2]),
    "where": (nd.where, [cond, x2, y2]),
    "_plus_scalar": (lambda x: x + 1.5, [x2]), "_mul_scalar": (lambda x: x * 3.0, [x2]),
    "_div_scalar": (lambda x: x / 4.0, [x2]), "_rminus_scalar": (lambda x: 1.0 - x, [x2]),
    "clip": (lambda x: nd.clip(x, -0.5, 0.5), [x2]), "abs": (nd.abs, [x2]),
    "negative": (nd.negative, [x2]), "sqrt": (nd.sqrt, [pos2]),
    "zeros_like": (nd.zeros_like, [x2]), "ones_like": (nd.ones_like, [x2]),
    "BlockGrad": (nd.BlockGrad, [x2]), "_copy": (nd.identity, [x2]),
    "max": (lambda x: nd.max(x, axis=1), [x2]), "min": (lambda x: nd.min(x, axis=1), [x2]),
    "tile": (lambda x: nd.tile(x, reps=(2, 1)), [x2]),
    "reverse": (lambda x: nd.flip(x, axis=0), [x2]),
    "_np_transpose": (lambda x: mx.np.transpose(x.as_np_ndarray()).as_nd_ndarray(), [x2]),
    "_npi_add": (lambda a, b: (a.as_np_ndarray() + b.as_np_ndarray()).as_nd_ndarray(), [x2, y2]),
    "_npx_relu": (lambda x: mx.npx.relu(x.as_np_ndarray()).as_nd_ndarray(), [x2]),
}

report = {}
for name, (fn, inputs) in CASES.items():
    ref = fn(*inputs).asnumpy()
    try:
        out = fn(*[nd.amp_cast(a, dtype=BF16) for a in inputs])
        dtype = "bfloat16" if out.dtype == BF16 else np.dtype(out.dtype).name
        got = nd.amp_cast(out, dtype="float32").asnumpy() if dtype == "bfloat16" else out.asnumpy()
    except mx.base.MXNetError as err:   # no bfloat16 kernel on this CPU: reported, not fatal
        report[name] = {"error": str(err).splitlines()[0][:120]}
        continue
    err = float(np.max(np.abs(got - ref))) / max(1.0, float(np.max(np.abs(ref))))
    report[name] = {"dtype": dtype, "rel_err": err}
nd.waitall()
print(json.dumps(report))
"""


def _run(args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.cpu_class
def test_bf16_core_ops_run_in_bf16_and_match_fp32():
    """~55 common neutral/widest/low-precision ops on bf16 input, in one fresh process: those
    the lists say this CPU class lacks a kernel for fail, every other one runs in bf16."""
    run = _run([sys.executable, "-c", SMOKE_SCRIPT])
    assert run.returncode == 0, "bf16 smoke process failed (crash or error):\n" + (
        run.stderr[-2000:])
    report = json.loads(run.stdout.strip().splitlines()[-1])
    lists = get_op_lists("bfloat16")
    not_lp = [n for n in report if lists.category(n.split("(")[0]) not in
              ("neutral", "widest", "low_precision", "conditional_fp32")]
    assert not not_lp, "smoke ops must be ones the bf16 lists run in bf16: %s" % not_lp
    missing = lists.missing_kernels(CPU_CLASS)
    failed = {n for n, r in report.items() if "error" in r}
    expected = {n for n in report if n.split("(")[0] in missing}
    assert failed == expected, "%s these ops failed on bf16 input: %s; the lists say %s lack a " \
        "kernel" % (where(), sorted(failed), sorted(expected))
    report = {n: r for n, r in report.items() if n not in failed}
    wrong_dtype = {n: r["dtype"] for n, r in report.items() if r["dtype"] != "bfloat16"}
    assert not wrong_dtype, "these ops did not return bfloat16: %s" % wrong_dtype
    # Inputs are bf16-exact, so only the op's own bf16 output rounding (<= 2**-9 relative) and
    # an intermediate rounding or two separate the results: allow 2**-7 of the output's scale.
    too_far = {n: round(r["rel_err"], 4) for n, r in report.items() if r["rel_err"] > 2 ** -7}
    assert not too_far, "bf16 results differ from fp32 beyond bf16 rounding: %s" % too_far
    assert len(report) + len(failed) >= 50, "the smoke run covers at least 50 ops"


def _probe(*args):
    run = _run([sys.executable, os.path.join("ci", "probe_bf16_kernels.py"), *args])
    rows = {}
    for line in run.stdout.splitlines():
        if line and not line.startswith("#"):
            name, status = line.split()[:2]
            rows[name] = status
    return run, rows


def _expected_status(op):
    return "no_kernel" if op in get_op_lists("bfloat16").missing_kernels(CPU_CLASS) else "ok"


def _bf16_list_ops():
    lists = get_op_lists("bfloat16")
    return sorted({registry()[op][1] for op in lists.low_precision | lists.missing_kernels("none")
                   if not op.startswith("_sg_")})  # fused ops exist only in partitioned graphs


FP16_NO_KERNEL_OPS = ["Convolution", "Deconvolution", "FullyConnected", "RNN", "dot",
                      "batch_dot", "_npi_matmul", "_contrib_interleaved_matmul_selfatt_qk",
                      "_npi_einsum"]


@pytest.fixture(scope="module")
def probe_runs():
    """The probe runs of the three tests below, started together: the probe reports kernels
    and crashes, never times."""
    commands = {"crashes": ("--ops", "transpose,Dropout,relu,FullyConnected"),
                "bf16 lists": ("--ops", ",".join(_bf16_list_ops())),
                "fp16": ("--dtype", "float16", "--ops", ",".join(FP16_NO_KERNEL_OPS))}
    return dict(zip(commands, map_side_by_side(lambda args: _probe(*args), commands.values())))


@pytest.mark.cpu_class
def test_probe_reports_crashes_and_missing_kernels(probe_runs):
    """The probe survives a heap-corrupting op and names what fails (the bf16 list's basis)."""
    run, rows = probe_runs["crashes"]
    assert rows == {"transpose": "crash", "Dropout": "no_kernel", "relu": "ok",
                    "FullyConnected": _expected_status("FullyConnected")}, \
        "probe output %s was:\n%s%s" % (where(), run.stdout, run.stderr[-800:])
    assert run.returncode == 1, "a failing op must give a non-zero exit status"


@pytest.mark.cpu_class
def test_bf16_kernels_per_cpu_class_match_the_lists(probe_runs):
    """The low-precision ops and every op the lists say some CPU class lacks a kernel for, run
    on bf16 input: 'no_kernel' exactly where the lists say so for this CPU's class."""
    ops = _bf16_list_ops()
    run, rows = probe_runs["bf16 lists"]
    assert set(rows) == set(ops), run.stdout + run.stderr[-800:]
    wrong = {op: status for op, status in rows.items() if status != _expected_status(op)}
    assert not wrong, "%s the probe disagrees with the lists: %s" % (where(), wrong)


def test_fp16_no_cpu_kernel_matches_the_cpu_build(probe_runs):
    run, rows = probe_runs["fp16"]
    rows = dict(rows)   # the fixture's, shared
    assert rows.pop("_npi_einsum") == "ok", "einsum has an fp16 CPU kernel"
    assert set(rows.values()) == {"no_kernel"}, (
        "NO_CPU_KERNEL ops must really lack an fp16 CPU kernel: %s" % rows)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_probe_amx_names_how_each_child_ended_and_stops_one_that_hangs(monkeypatch):
    """ci/probe_amx.py's verdicts, with the child's work replaced (any CPU): a clean result,
    a wrong one, an abort, and a child that never ends, which is stopped at the deadline
    (on an AMX host crashing children sat idle ~45 s each) and counted as failed."""
    import importlib.util
    import time
    import mxamp.backend.forked  # noqa: F401 - the child imports it; imported here, it is quick
    # the script sets these at import, for its own process: this one gets them back after
    saved = {n: os.environ.get(n) for n in ("MXNET_ENGINE_TYPE", "MALLOC_CHECK_", "MXAMP_AMX",
                                            "OMP_NUM_THREADS")}
    try:
        spec = importlib.util.spec_from_file_location(
            "probe_amx", os.path.join(os.path.dirname(os.path.dirname(__file__)), "ci",
                                      "probe_amx.py"))
        probe_amx = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe_amx)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    monkeypatch.setattr(probe_amx, "CHILD_SECONDS", 1)
    for work, want in ((lambda *a: 0.0, "ok"), (lambda *a: 1.0, "WRONG"),
                       (lambda *a: os.abort(), "CRASH (-6)"),
                       (lambda *a: time.sleep(60), "HUNG (1 s)")):
        monkeypatch.setattr(probe_amx, "run_shape", work)
        start = time.monotonic()
        assert probe_amx.in_child((32, 1, 27)) == want
        assert time.monotonic() - start < 10, "%s took too long to be told" % want
