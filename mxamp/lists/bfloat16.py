"""Op lists for the bfloat16 target (CPU, oneDNN): what differs from :mod:`mxamp.lists.common`,
and why.

Plain data read by :func:`mxamp.lists.get_op_lists`; the layout and rules are in
:mod:`mxamp.lists.common`'s docstring. Everything bfloat16 and float16 agree on is stated there.
This module states only bfloat16's own entries, the ``DIFF_*`` tables, each section with the
reason it differs, plus its CPU-kernel tables. At import :func:`~mxamp.lists.common.compose`
joins the two into the full tables (LOW_PRECISION, FP32, WIDEST, NEUTRAL, CONDITIONAL_FP32,
LOSS_OUTPUT, FP32_PARAMS) that this module exports.

bfloat16 has float32's exponent range but only 8 significant bits, so precision-sensitive ops
(reductions, softmax, norms, losses, exp/log) stay float32 as for float16 (common). Where a
bfloat16 kernel works but is MXNet's generic one, 2-30x slower than float32 (scalar arithmetic,
``clip``, comparisons, ``broadcast_*``, ...), the op computes in float32 for speed
(``SLOW_BF16``, timed by ``ci/probe_bf16_speed.py``).

MXNet 1.9.1 lacks bfloat16 CPU kernels for many
ops: each op in the NEUTRAL, WIDEST, LOW_PRECISION and CONDITIONAL_FP32 tables was run on
bfloat16 input by ``ci/probe_bf16_kernels.py`` (2-D and 4-D shapes, forked child per op, results
compared with float32); the ones that raise, crash or give wrong numbers sit in DIFF_FP32 under
"No working bfloat16 CPU kernel" with the probe's finding as the reason. The same probe with
``--backward`` compares input gradients: the ops whose bfloat16 backward raises or gives zeros
(``gather_nd``, ``mod``, numpy ``where`` and ``broadcast_to``, ...) are float32 as well.
``transpose`` is the one that corrupts the heap; ``Embedding`` (forward, backward, hybridized)
and ``_np_transpose`` work and stay neutral.

Low precision here means oneDNN bf16 kernels: Convolution, Deconvolution, FullyConnected (all
common). ``dot``, ``batch_dot``, ``_linalg_gemm*``, numpy matmul/einsum/tensordot, the
interleaved attention matmuls and RNN have no bfloat16 CPU kernel and are FP32 (the patcher may
still route a 2-D ``dot`` onto FullyConnected). Fixes to the reference's ``symbol_bf16.py``:
Concat is widest (GluonCV YOLOv3: "Non-uniform data type in Concat"), ops with no tensor input
are neutral (they crashed hybridized blocks), the interleaved matmuls are classified.

>>> DIFF_FP32['Dropout'] == R_NO_BF16 == FP32['Dropout']
True
"""
from mxamp.lists import common
# Re-exported: the full tables below hold them, and readers find them here as before.
from mxamp.lists.common import (R_BOX, R_CTRL, R_IMG, R_INT, R_LINALG, R_NOIN, R_NO_KERNEL, R_OPT,
                                R_PDF, R_QUANT, R_RAND, R_SG)

TARGET = "bfloat16"

# Reasons only bfloat16 uses.
R_ATT_BF16 = "CPU kernel is float32 only (\"Only FP32 is supported on CPU\")"
R_GEMM_BF16 = "CPU kernel is float32/float64 only (\"only supports float32/float64 for CPU\")"
R_HEAP = "bfloat16 kernel corrupts the heap (process aborts; probe: double free)"
R_LEAKY_BF16 = ("no bfloat16 kernel for selu/rrelu (probe); prelu's float32 gamma must match the "
                "data's dtype")
R_NO_BF16 = "no bfloat16 CPU kernel in MXNet 1.9.1 (probe: Unknown type enum 12)"
R_POOL_BF16 = "no bfloat16 kernel for sum/lp pooling (probe); max/avg use oneDNN"
R_MOD_GRAD = ("bfloat16 backward gives zero gradients (backward probe: relative error 1 against "
              "float32; forward is right)")
R_NO_BF16_GRAD = ("no bfloat16 backward kernel in MXNet 1.9.1 (backward probe: Unknown type enum "
                  "12 or not a float type)")
R_WHERE_GRAD = ("bfloat16 backward refused (backward probe: \"Backward only supports float "
                "types!\")")
R_SOFTSIGN = "no bfloat16 kernel for softsign (probe); softrelu is fine in bfloat16's range"

# Cast to bfloat16: nothing beyond common's oneDNN Convolution, Deconvolution, FullyConnected.
DIFF_LOW_PRECISION = {}

# Cast to float32: no bfloat16 CPU kernel. float16 has GPU kernels for all of these (low
# precision, widest or neutral there).
DIFF_FP32 = {
    # Matrix products and RNN without a bfloat16 CPU kernel (low precision for float16)
    "dot": R_GEMM_BF16, "_sparse_dot": R_GEMM_BF16, "batch_dot": R_GEMM_BF16,
    "_npx_batch_dot": R_GEMM_BF16, "_npi_matmul": R_GEMM_BF16,
    "_npi_tensordot_int_axes": R_GEMM_BF16, "_np_dot": R_NO_BF16, "_npi_tensordot": R_NO_BF16,
    "_npi_einsum": R_NO_BF16, "_contrib_interleaved_matmul_selfatt_qk": R_ATT_BF16,
    "_contrib_interleaved_matmul_selfatt_valatt": R_ATT_BF16,
    "_contrib_interleaved_matmul_encdec_qk": R_ATT_BF16,
    "_contrib_interleaved_matmul_encdec_valatt": R_ATT_BF16, "RNN": R_NO_BF16,
    "_npx_rnn": R_NO_BF16,

    # No working bfloat16 CPU kernel (ci/probe_bf16_kernels.py); float16 runs them as is
    "transpose": R_HEAP, "Dropout": R_NO_BF16, "_npx_dropout": R_NO_BF16,
    "hard_sigmoid": R_NO_BF16, "im2col": R_NO_BF16, "col2im": R_NO_BF16, "Pad": R_NO_BF16,
    "pad": R_NO_BF16, "Pooling_v1": R_NO_BF16, "UpSampling": R_NO_BF16,
    "_npi_true_divide": R_NO_BF16, "_npi_true_divide_scalar": R_NO_BF16,
    "_npi_arctan2": "bfloat16 is not a float to this kernel (\"Do not support `int` as input\")",
    "Correlation": R_NO_BF16, "BilinearSampler": R_NO_BF16, "_contrib_ROIAlign": R_NO_BF16,
    "ROIPooling": R_NO_BF16, "_npx_roi_pooling": R_NO_BF16, "_contrib_PSROIPooling": R_NO_BF16,
    "_contrib_RROIAlign": R_NO_BF16, "SpatialTransformer": R_NO_BF16,
    "_contrib_bipartite_matching": R_NO_BF16, "_random_exponential_like": R_NO_BF16,
    "_random_gamma_like": R_NO_BF16, "_random_generalized_negative_binomial_like": R_NO_BF16,
    "_random_negative_binomial_like": R_NO_BF16, "_random_normal_like": R_NO_BF16,
    "_random_poisson_like": R_NO_BF16, "_random_uniform_like": R_NO_BF16,
    "_sample_multinomial": R_NO_BF16, "sample_multinomial": R_NO_BF16,

    # Forward works, backward does not (ci/probe_bf16_kernels.py --backward, the same on the
    # native, emulated and none classes): training through them in bfloat16 raised, or got
    # zero gradients. Float32 costs two casts where they appear; inference loses nothing else.
    "gather_nd": R_NO_BF16_GRAD, "_npi_gather_nd": R_NO_BF16_GRAD,
    "_npx_gather_nd": R_NO_BF16_GRAD, "_npi_broadcast_to": R_NO_BF16_GRAD,
    "_npi_ediff1d": R_NO_BF16_GRAD, "_npi_nan_to_num": R_NO_BF16_GRAD,
    "_npi_pareto": R_NO_BF16_GRAD, "_npi_weibull": R_NO_BF16_GRAD,
    "_npi_where": R_WHERE_GRAD, "_npi_where_lscalar": R_WHERE_GRAD,
    "_npi_where_rscalar": R_WHERE_GRAD,
    "_mod": R_MOD_GRAD, "_Mod": R_MOD_GRAD, "broadcast_mod": R_MOD_GRAD, "_npi_mod": R_MOD_GRAD,
    "_mod_scalar": R_MOD_GRAD, "_ModScalar": R_MOD_GRAD, "_rmod_scalar": R_MOD_GRAD,
    "_RModScalar": R_MOD_GRAD, "_npi_mod_scalar": R_MOD_GRAD, "_npi_rmod_scalar": R_MOD_GRAD,
}

# Every op above computes in float32 on any CPU, whatever category an override list gives it:
# none has a working bfloat16 CPU kernel on any class, and a bfloat16 transpose corrupts the
# heap on every class (measured on the Zen 4: "malloc(): corrupted top size" natively and under
# DNNL_MAX_CPU_ISA=AVX512_CORE, a segfault under AVX2). Before, amp.init('bfloat16',
# fp32_ops=['dot']), whose list replaces the default, left transpose dtype-neutral, and the
# first bfloat16 tensor it met aborted the process ("free(): corrupted unsorted chunks").
FP32_ON_EVERY_CPU = dict(DIFF_FP32)

# Cast to float32 for speed: the bfloat16 kernel works, but it is MXNet's generic one, which
# converts every element to float and back in scalar code, while oneDNN computes the ops not
# listed here (Activation, LeakyReLU, Pooling, BatchNorm, elemwise_add, Concat, ...).
# ci/probe_bf16_speed.py timed every op of the tables below at activation size (401,408
# elements, forward and backward) on the Zen 4: these ran slower in bfloat16 than float32 plus
# the two casts that computing them in float32 costs (by more than 1.25x); the number is each
# op's bfloat16/float32 time. A model full of them (MobileNetV3's hard-swish and
# squeeze-excitation) trained at 0.32x float32's speed with them in bfloat16, 1.02x with them
# in float32. As a side effect, a broadcasting op's backward now sums in float32, not in
# bfloat16 (0.7-4.8% relative error over 49-12,544 elements). The kernel is the same code on
# every CPU; unlike the broken kernels above, an override list may move these back
# (amp.init(target_precision_ops=[...]) or a tuned policy).
def _slow(ratio):
    return ("MXNet's generic bfloat16 kernel (no oneDNN) ran %.1fx float32's time, forward and "
            "backward (ci/probe_bf16_speed.py, Zen 4)" % ratio)


SLOW_BF16 = {
    "abs": _slow(5.8), "arccosh": _slow(3.3), "arcsinh": _slow(3.0), "arctan": _slow(4.1),
    "argmax": _slow(6.7), "argmax_channel": _slow(7.1), "argmin": _slow(6.5),
    "broadcast_add": _slow(9.3), "broadcast_div": _slow(18.5), "broadcast_equal": _slow(5.4),
    "broadcast_greater": _slow(4.4), "broadcast_greater_equal": _slow(4.8),
    "broadcast_lesser": _slow(4.8), "broadcast_lesser_equal": _slow(4.8),
    "broadcast_logical_and": _slow(4.0), "broadcast_logical_or": _slow(2.6),
    "broadcast_logical_xor": _slow(4.9), "broadcast_maximum": _slow(16.0),
    "broadcast_minimum": _slow(16.1), "broadcast_minus": _slow(10.0),
    "broadcast_mul": _slow(13.7), "broadcast_not_equal": _slow(3.9), "broadcast_plus": _slow(9.3),
    "broadcast_sub": _slow(10.0), "cbrt": _slow(2.9), "ceil": _slow(3.4), "clip": _slow(2.8),
    "_contrib_allclose": _slow(6.6), "_contrib_arange_like": _slow(3.8),
    "_contrib_BilinearResize2D": _slow(2.8), "_contrib_div_sqrt_dim": _slow(9.3),
    "_contrib_gradientmultiplier": _slow(6.6), "_contrib_quadratic": _slow(11.1),
    "_contrib_round_ste": _slow(4.3), "_contrib_sign_ste": _slow(3.3), "cos": _slow(4.9),
    "degrees": _slow(11.0), "_Div": _slow(17.9), "_div": _slow(17.9), "_div_scalar": _slow(9.6),
    "_DivScalar": _slow(9.6), "elemwise_div": _slow(17.9), "elemwise_mul": _slow(13.8),
    "elemwise_sub": _slow(9.0), "_equal": _slow(4.3), "_Equal": _slow(4.3),
    "_equal_scalar": _slow(4.5), "_EqualScalar": _slow(4.5), "fix": _slow(3.1),
    "floor": _slow(2.9), "_greater": _slow(5.0), "_Greater": _slow(5.0),
    "_greater_equal": _slow(4.2), "_Greater_Equal": _slow(4.2),
    "_greater_equal_scalar": _slow(5.5), "_greater_scalar": _slow(4.8),
    "_GreaterEqualScalar": _slow(5.5), "_GreaterScalar": _slow(4.8), "_lesser": _slow(5.5),
    "_Lesser": _slow(5.5), "_lesser_equal": _slow(5.8), "_Lesser_Equal": _slow(5.8),
    "_lesser_equal_scalar": _slow(5.2), "_lesser_scalar": _slow(6.0),
    "_LesserEqualScalar": _slow(5.2), "_LesserScalar": _slow(6.0), "_logical_and": _slow(4.4),
    "_Logical_And": _slow(4.4), "_logical_and_scalar": _slow(4.7), "logical_not": _slow(3.7),
    "_logical_or": _slow(2.8), "_Logical_Or": _slow(2.8), "_logical_or_scalar": _slow(3.3),
    "_logical_xor": _slow(4.6), "_Logical_Xor": _slow(4.6), "_logical_xor_scalar": _slow(7.1),
    "_LogicalAndScalar": _slow(4.7), "_LogicalOrScalar": _slow(3.3),
    "_LogicalXorScalar": _slow(7.1), "max": _slow(4.4), "max_axis": _slow(4.4),
    "_maximum": _slow(18.3), "_Maximum": _slow(18.3), "_maximum_scalar": _slow(15.7),
    "_MaximumScalar": _slow(15.7), "min": _slow(3.8), "min_axis": _slow(3.8),
    "_minimum": _slow(14.6), "_Minimum": _slow(14.6), "_minimum_scalar": _slow(17.1),
    "_MinimumScalar": _slow(17.1), "_Minus": _slow(9.0), "_minus": _slow(9.0),
    "_minus_scalar": _slow(7.9), "_MinusScalar": _slow(7.9), "_Mul": _slow(13.8),
    "_mul": _slow(13.8), "_mul_scalar": _slow(8.2), "_MulScalar": _slow(8.2),
    "negative": _slow(8.8), "_not_equal": _slow(5.2), "_Not_Equal": _slow(5.2),
    "_not_equal_scalar": _slow(5.4), "_NotEqualScalar": _slow(5.4), "_np_all": _slow(2.6),
    "_np_amax": _slow(3.7), "_np_amin": _slow(3.9), "_np_any": _slow(2.3), "_np_max": _slow(3.7),
    "_np_min": _slow(3.9), "_np_sometrue": _slow(2.3), "_npi_abs": _slow(5.9),
    "_npi_absolute": _slow(5.9), "_npi_add": _slow(13.8), "_npi_add_scalar": _slow(7.6),
    "_npi_arccosh": _slow(3.4), "_npi_arcsinh": _slow(3.4), "_npi_arctan": _slow(4.7),
    "_npi_arctan2_scalar": _slow(4.4), "_npi_argmax": _slow(8.7), "_npi_argmin": _slow(8.3),
    "_npi_around": _slow(8.2), "_npi_cbrt": _slow(2.8), "_npi_ceil": _slow(2.4),
    "_npi_clip": _slow(2.8), "_npi_copysign": _slow(4.2), "_npi_copysign_scalar": _slow(14.0),
    "_npi_cos": _slow(4.2), "_npi_degrees": _slow(7.7), "_npi_diff": _slow(4.0),
    "_npi_equal": _slow(10.3), "_npi_equal_scalar": _slow(7.8), "_npi_fix": _slow(3.2),
    "_npi_floor": _slow(2.8), "_npi_greater": _slow(10.2), "_npi_greater_equal": _slow(9.6),
    "_npi_greater_equal_scalar": _slow(6.2), "_npi_greater_scalar": _slow(8.6),
    "_npi_less": _slow(11.2), "_npi_less_equal": _slow(9.9),
    "_npi_less_equal_scalar": _slow(10.4), "_npi_less_scalar": _slow(9.9),
    "_npi_logical_not": _slow(7.9), "_npi_maximum": _slow(16.0),
    "_npi_maximum_scalar": _slow(15.7), "_npi_minimum": _slow(16.1),
    "_npi_minimum_scalar": _slow(17.1), "_npi_multiply": _slow(15.3),
    "_npi_multiply_scalar": _slow(11.6), "_npi_negative": _slow(9.7), "_npi_nonzero": _slow(2.2),
    "_npi_not_equal": _slow(8.4), "_npi_not_equal_scalar": _slow(9.4),
    "_npi_radians": _slow(12.0), "_npi_rarctan2_scalar": _slow(4.8),
    "_npi_rcopysign_scalar": _slow(20.5), "_npi_rint": _slow(3.8),
    "_npi_rsubtract_scalar": _slow(10.6), "_npi_sign": _slow(4.2), "_npi_sin": _slow(4.8),
    "_npi_sqrt": _slow(3.5), "_npi_square": _slow(11.8), "_npi_subtract": _slow(13.1),
    "_npi_subtract_scalar": _slow(8.2), "_npi_tanh": _slow(3.3), "_npi_trunc": _slow(2.6),
    "_npi_unique": _slow(2.9), "_npi_where_scalar2": _slow(1.9), "_npx_arange_like": _slow(3.8),
    "_npx_nonzero": _slow(2.2), "_npx_relu": _slow(9.5), "_npx_sigmoid": _slow(7.2),
    "_npx_topk": _slow(3.4), "_plus_scalar": _slow(7.8), "_PlusScalar": _slow(7.8),
    "radians": _slow(10.1), "relu": _slow(9.3), "rint": _slow(3.9), "_rminus_scalar": _slow(8.3),
    "_RMinusScalar": _slow(8.3), "round": _slow(2.8), "_scatter_elemwise_div": _slow(17.6),
    "_scatter_minus_scalar": _slow(8.8), "_scatter_plus_scalar": _slow(7.4),
    "sigmoid": _slow(10.2), "sign": _slow(3.8), "sin": _slow(4.4), "softsign": _slow(12.8),
    "_sparse__contrib_round_ste": _slow(4.3), "_sparse__contrib_sign_ste": _slow(3.3),
    "_sparse_abs": _slow(5.8), "_sparse_arccosh": _slow(3.3), "_sparse_arcsinh": _slow(3.0),
    "_sparse_arctan": _slow(4.1), "_sparse_broadcast_add": _slow(9.3),
    "_sparse_broadcast_div": _slow(18.5), "_sparse_broadcast_minus": _slow(10.0),
    "_sparse_broadcast_mul": _slow(13.7), "_sparse_broadcast_plus": _slow(9.3),
    "_sparse_broadcast_sub": _slow(10.0), "_sparse_cbrt": _slow(2.9), "_sparse_ceil": _slow(3.4),
    "_sparse_clip": _slow(2.8), "_sparse_cos": _slow(4.9), "_sparse_degrees": _slow(11.0),
    "_sparse_elemwise_div": _slow(17.9), "_sparse_elemwise_mul": _slow(13.8),
    "_sparse_elemwise_sub": _slow(9.0), "_sparse_fix": _slow(3.1), "_sparse_floor": _slow(2.9),
    "_sparse_negative": _slow(8.8), "_sparse_radians": _slow(10.1), "_sparse_relu": _slow(9.3),
    "_sparse_rint": _slow(3.9), "_sparse_round": _slow(2.8), "_sparse_sigmoid": _slow(10.2),
    "_sparse_sign": _slow(3.8), "_sparse_sin": _slow(4.4), "_sparse_sqrt": _slow(3.8),
    "_sparse_square": _slow(12.7), "_sparse_tanh": _slow(4.4), "_sparse_trunc": _slow(3.5),
    "_sparse_where": _slow(2.2), "sqrt": _slow(3.8), "square": _slow(12.7), "_sub": _slow(9.0),
    "tanh": _slow(4.4), "topk": _slow(3.4), "trunc": _slow(3.5), "where": _slow(2.2),
}
DIFF_FP32 = {**DIFF_FP32, **SLOW_BF16}

# Slow generic ops that compute the same function as a oneDNN Activation: op -> its act_type.
# On bfloat16 data the patcher calls Activation for them instead of casting to float32 (where
# the default lists are in force and Activation computes in bfloat16 on the CPU), so F.relu
# in a user's block costs no cast. The converter's graph pass casts them to float32 instead.
ONEDNN_TWINS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "_npx_relu": "relu",
                "_npx_sigmoid": "sigmoid", "_npi_tanh": "tanh"}

# Multi-input ops: nothing beyond common's (float16's extra ones lack a bfloat16 kernel: FP32).
DIFF_WIDEST = {}

# Run in the dtype their input already has; AMP never casts around them. float16 keeps these
# in float32 (range, or no float16 kernel).
DIFF_NEUTRAL = {
    # Working bfloat16 kernel where float16 has none (square and around have one too, but it
    # is slow: SLOW_BF16)
    "_contrib_BatchNormWithReLU": "oneDNN kernel takes bfloat16 data with float32 statistics",
}

# float32 only when the parameter has one of the values; else the input's dtype.
# op name -> (parameter, [values], reason). The values are the modes without a bfloat16 kernel
# (probe); float16's range problems (softrelu, elu) do not arise in bfloat16's range.
DIFF_CONDITIONAL_FP32 = {
    "Activation": ("act_type", ["softsign"], R_SOFTSIGN),
    "_npx_activation": ("act_type", ["softsign"], R_SOFTSIGN),
    "LeakyReLU": ("act_type", ["selu", "rrelu", "prelu"], R_LEAKY_BF16),
    "_npx_leaky_relu": ("act_type", ["selu", "rrelu", "prelu"], R_LEAKY_BF16),
    "Pooling": ("pool_type", ["sum", "lp"], R_POOL_BF16),
    "_npx_pooling": ("pool_type", ["sum", "lp"], R_POOL_BF16),
}

# The full tables: common.py's entries with the differences above in their place.
# LOSS_OUTPUT and FP32_PARAMS are common's (bfloat16 states no table of its own).
(LOW_PRECISION, FP32, WIDEST, NEUTRAL, CONDITIONAL_FP32, LOSS_OUTPUT,
 FP32_PARAMS) = common.compose(
    low_precision=DIFF_LOW_PRECISION, fp32=DIFF_FP32, widest=DIFF_WIDEST, neutral=DIFF_NEUTRAL,
    conditional_fp32=DIFF_CONDITIONAL_FP32)

# Every LOW_PRECISION op (common's oneDNN ones) has a bfloat16 CPU kernel: that is why it is
# listed. Below avx512_core oneDNN has none, which NO_KERNEL_BY_CPU_CLASS states per CPU class.
NO_CPU_KERNEL = {}

# Ops with no bfloat16 kernel on CPUs of one bfloat16 class (mxamp.backend.cpu.BF16_CLASSES), found by
# running ci/probe_bf16_kernels.py on each class. oneDNN 2.4 implements bfloat16 only from
# avx512_core up, so on a 'none' CPU (AVX2, or oneDNN capped below AVX512_CORE) every oneDNN
# operator lacks it: "could not create a primitive descriptor iterator". MXNet's own kernels
# (casts, elementwise, reshapes, Concat, Embedding, ...) run on every class. mxamp computes
# these ops in float32 there, whatever their category. 'emulated', 'native' and 'amx' CPUs
# lack nothing.
R_ONEDNN_NONE = "oneDNN op: no bfloat16 kernel below avx512_core (probe on AVX2: no_kernel)"
R_ONEDNN_FUSED = ("fused oneDNN op: no bfloat16 kernel below avx512_core (not probed: it "
                  "exists only in partitioned graphs)")
NO_KERNEL_BY_CPU_CLASS = {
    "none": {
        "Convolution": R_ONEDNN_NONE, "_npx_convolution": R_ONEDNN_NONE,
        "Deconvolution": R_ONEDNN_NONE, "_npx_deconvolution": R_ONEDNN_NONE,
        "FullyConnected": R_ONEDNN_NONE, "_npx_fully_connected": R_ONEDNN_NONE,
        "_sparse_FullyConnected": R_ONEDNN_NONE,
        "BatchNorm": R_ONEDNN_NONE, "_npx_batch_norm": R_ONEDNN_NONE,
        "_contrib_BatchNormWithReLU": R_ONEDNN_NONE,
        "Pooling": R_ONEDNN_NONE, "_npx_pooling": R_ONEDNN_NONE,
        "Activation": R_ONEDNN_NONE, "_npx_activation": R_ONEDNN_NONE,
        "LeakyReLU": R_ONEDNN_NONE, "_npx_leaky_relu": R_ONEDNN_NONE,
        "_sg_mkldnn_conv": R_ONEDNN_FUSED, "_sg_mkldnn_fully_connected": R_ONEDNN_FUSED,
        "_sg_mkldnn_selfatt_qk": R_ONEDNN_FUSED, "_sg_mkldnn_selfatt_valatt": R_ONEDNN_FUSED,
    },
}

# Shapes that run in float32 on CPUs of one bfloat16 class whatever the op's category, each a
# conditions.Condition written as (tests, if_unknown, reason). On 'amx' (oneDNN 2.4 with
# DNNL_MAX_CPU_ISA=AVX512_CORE_AMX, Sapphire Rapids) a bfloat16 1x1 stride-1 convolution
# corrupts the heap (glibc abort or segfault, forward alone, any batch and C_out) when its
# per-image H*W is 27, 33, 36, 39, 42, 45 or 48 and its C_in a multiple of 32: a scan of H*W
# 1..600 at C_in 64 and 1..128 at C_in 32..2048 found exactly these (NOTES.md section 2,
# ci/probe_amx.py; re-measured on an AMX Xeon in hw-runs/2026-11-25-xeon-amx: 26 of 125 shapes
# crashed, all of them in this family). The rule covers the range the family spans, H*W 27..48,
# with C_in a multiple of 16 (16, 48, 80 passed: a margin). Sizes just outside (26, 49) were
# scanned and pass; 49 is ResNet-50's last stage at 224 px, which must keep AMX. Where the
# shapes cannot be known (a Symbol graph built without input shapes) it holds: safety first.
R_AMX_HEAP = ("oneDNN 2.4 AMX: bfloat16 1x1 stride-1 convolutions with per-image H*W in "
              "{27,33,...,48} and C_in % 32 == 0 corrupt the heap (measured on Sapphire "
              "Rapids and an AMX Xeon); kept in float32 over the span H*W 27..48, C_in % 16 == 0")
_AMX_HEAP_SHAPES = (
    (("kernel", ("1",)), ("stride", ("1",)), ("in_channels", ("%16",)),
     ("spatial_size", ("27..48",))),
    True, R_AMX_HEAP)
# A speed rule on every class with bfloat16 kernels: oneDNN 2.4's bfloat16 depthwise kernel
# (jit_dw:avx512_core_bf16) takes channels in blocks of 16, and a depthwise convolution whose
# channel count is not a multiple of 16 falls to gemm:jit, a generic path. float32 has an
# 8-channel kernel (jit_dw:avx2) for those. MobileNetV3-Large (72, 120, 184, 200 channels),
# batch 8 at 224 px on the Zen 4, one training step per oneDNN's verbose output: 23.2 ms bf16
# against 1.1 ms fp32 (g120, 5x5, forward), 44.0 against 1.5 (its backward), 133 ms of the
# step in all; the same gemm fallback under DNNL_MAX_CPU_ISA=AVX512_CORE (emulated). Not
# measured on AMX, which dispatches depthwise convolutions to the same avx512_core_bf16
# family in oneDNN 2.4: ci/device_amx.sh's verbose logs will say. Where the shape cannot be
# known the convolution stays in bfloat16.
R_DW_NOT_16 = ("oneDNN 2.4 has no bfloat16 depthwise kernel for channel counts that are not a "
               "multiple of 16 (gemm:jit: 10-40x float32's jit_dw:avx2, MobileNetV3 on a Zen 4)")
_DW_NOT_16 = ((("depthwise", ("True",)), ("in_channels", ("!%16",))), False, R_DW_NOT_16)
# A speed rule of the classes without AMX: oneDNN 2.4's bfloat16 convolutions (jit_bf16,
# jit_bf16_1x1) take input and output channels in blocks of 16. A dense or pointwise
# convolution with either count off that grid (a stem's 3 input channels too) falls to
# gemm:jit and hands its output on in plain layout, where the BatchNorm after it runs
# ncsp_bnorm: in bfloat16 3-4x that kernel's float32 time (ShuffleNet V2's 58/116/232 channels:
# 48.7 ms bf16 against 15.0 ms fp32 per step). In float32 the same convolutions take 8-channel
# kernels (jit:avx2, jit_1x1:avx2) and the BatchNorm after them bnorm_jit. One training step
# each, GluonCV at 112 px on the Zen 4, fresh processes, best of 4 (alternating, 2 rounds):
# ShuffleNet V2 123-137 ms -> 84 ms (float32 80), MobileNet V2 251 -> 208-219 (226),
# MobileNetV3-Small 119-122 -> 97-99 (89). Training only: for inference (forward_inference)
# oneDNN runs a 1x1 convolution from 24 channels on brgconv_1x1 in nhwc, and the BatchNorm
# after it on bnorm_jit (verbose output, same CPU); converted models keep their bfloat16
# convolutions. Grouped and depthwise convolutions have rules of their own. Not on 'amx',
# whose brgconv kernels lay data out as nhwc at any channel count (not measured there).
# Where the shape cannot be known the convolution stays in bfloat16.
R_CONV_NOT_16 = ("oneDNN 2.4's bfloat16 convolutions take channels in blocks of 16; off them "
                 "(a stem too) they train on gemm:jit in plain layout, and the BatchNorm after "
                 "them on ncsp_bnorm, 3-4x float32 (ShuffleNet V2, MobileNet V2 on a Zen 4)")
_TRAINING_DENSE = (("training", ("True",)), ("conv_kind", ("stem", "pointwise", "dense")))
_CONV_NOT_16 = ((_TRAINING_DENSE + (("in_channels", ("!%16",)),), False, R_CONV_NOT_16),
                (_TRAINING_DENSE + (("num_filter", ("!%16",)),), False, R_CONV_NOT_16))
# Natively, bfloat16's GEMM gains grow with the channel count and the layout costs do not: from
# 256 channels on, gemm:jit in bfloat16 beats float32's 8-channel kernels by more than its
# plain layout costs. Two Xception-like units (ReLU, depthwise 3x3, pointwise, BatchNorm; C in,
# C out, batch 8 at 14x14, one process a row, median ms, Zen 4, one OpenMP thread): C=120
# float32 15.5, rule 14.3, bfloat16 17.2; C=232 48.9, 42.3, 42.4 (at 28x28: 169, 177, 182);
# C=296 at 28x28 261, 273, 244; C=360 108, 91, 78; C=488 148, 160, 120; C=600 228, 229, 176;
# C=728 325-335, 339-355, 256-276; with two threads C=728 195-213, 202-206, 130-140. Emulated
# bfloat16 loses there too (C=488: 170, 172, 461) and keeps the rule whole.
R_CONV_NOT_16_NATIVE = R_CONV_NOT_16 + "; up to 255 channels (from 256 on bfloat16 gains)"
_CONV_NOT_16_NATIVE = (
    (_TRAINING_DENSE + (("in_channels", ("!%16",)), ("in_channels", ("<=255",))), False,
     R_CONV_NOT_16_NATIVE),
    (_TRAINING_DENSE + (("num_filter", ("!%16",)), ("num_filter", ("<=255",))), False,
     R_CONV_NOT_16_NATIVE))
R_BATCHNORM_NOT_16 = ("a BatchNorm on bfloat16 data off 16-channel blocks gets it in plain "
                      "layout and trains on ncsp_bnorm, 3-4x float32: O2's BatchNorms, which "
                      "take bfloat16 data (ShuffleNet V2 at 0.64x float32 on a Zen 4)")
_BATCHNORM_NOT_16 = (((("training", ("True",)), ("in_channels", ("!%16",))), False,
                      R_BATCHNORM_NOT_16),)
_CONVOLUTIONS = ("Convolution", "_npx_convolution", "_sg_mkldnn_conv")
FP32_WHEN_BY_CPU_CLASS = {
    "amx": {op: (_AMX_HEAP_SHAPES, _DW_NOT_16) for op in _CONVOLUTIONS},
    "native": dict({op: (_DW_NOT_16,) + _CONV_NOT_16_NATIVE for op in _CONVOLUTIONS},
                   BatchNorm=_BATCHNORM_NOT_16),
    "emulated": dict({op: (_DW_NOT_16,) + _CONV_NOT_16 for op in _CONVOLUTIONS},
                     BatchNorm=_BATCHNORM_NOT_16),
}
