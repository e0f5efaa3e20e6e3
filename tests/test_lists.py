"""Op lists: every registered operator is classified, the tables are consistent, and the facts
they encode hold for the real MXNet 1.9.1 registry (``test_lists_kernels.py`` runs the kernels).

"Backward" in these tests means a pure-backward helper: an operator whose name has ``backward``
as one of its underscore-separated words (``_backward_FullyConnected``, ``_split_v2_backward``,
``_contrib_backward_quadratic``, ``_npi_hsplit_backward``...). They follow their forward op and
are not listed; every other registered name is a forward op and must be classified.
"""
import functools

import numpy as np
import pytest

import mxnet as mx

from mxamp import amp
from mxamp.backend.cpu import BF16_CLASSES
from mxamp.lists import bfloat16 as bf16_data
from mxamp.lists import float16 as fp16_data
from mxamp.lists import get_op_lists
from mxamp.backend.registry import op_info

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
    ("float16", "square", "fp32", "overflows fp16"), ("bfloat16", "square", "fp32", "generic bf16 kernel slow"),
    ("float16", "sum", "fp32", ""), ("bfloat16", "_np_sum", "fp32", ""),
    ("float16", "SoftmaxOutput", "fp32", ""), ("float16", "_image_normalize", "neutral", ""),
    ("float16", "Custom", "fp32", "user code assumes float32"),
    ("float16", "_CustomFunction", "neutral", ""), ("float16", "_sg_mkldnn_conv", "neutral", ""),
    ("float16", "Activation", "conditional_fp32", "softrelu"),
    ("bfloat16", "Pooling", "conditional_fp32", "sum/lp pooling have no bf16 kernel"),
    ("bfloat16", "Activation", "conditional_fp32", "oneDNN kernel, softsign none"),
    ("bfloat16", "relu", "fp32", "generic bf16 kernel slow"),
    ("bfloat16", "_mul_scalar", "fp32", "generic bf16 kernel slow"),
    ("bfloat16", "broadcast_mul", "fp32", "generic bf16 kernel slow"),
    ("bfloat16", "elemwise_add", "widest", "oneDNN sum: fast in bf16"),
    ("bfloat16", "Reshape", "neutral", "data movement: no cast"),
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
    # 47: MXNet 1.9.1's registry (the creation ops and samplers); another build changes it
    assert len(no_inputs) == 47, "expected the creation and sampler ops, got %s" % no_inputs
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
