"""Op lists for the float16 target (GPU kernels; see the CPU notes below): what differs from
:mod:`mxamp.lists.common`, and why.

Plain data read by :func:`mxamp.lists.get_op_lists`; the layout and rules are in
:mod:`mxamp.lists.common`'s docstring. Everything float16 and bfloat16 agree on is stated there.
This module states only float16's own entries, the ``DIFF_*`` tables, each section with the
reason it differs, plus its CPU-kernel tables. At import :func:`~mxamp.lists.common.compose`
joins the two into the full tables (LOW_PRECISION, FP32, WIDEST, NEUTRAL, CONDITIONAL_FP32,
LOSS_OUTPUT, FP32_PARAMS) that this module exports. Nearly every difference has one cause:
float16 targets GPUs, where MXNet 1.9.1 has float16 kernels that its bfloat16 CPU build lacks
(GEMMs, RNN, attention matmuls, Dropout, ROI and sampling ops); the rest comes from float16's
narrow range (``square``, ``softrelu``, ``elu``), which bfloat16 does not share.

Choices that differ from the reference (``mxnet/contrib/amp/lists/symbol_fp16.py``):
GEMMs (``dot``, ``batch_dot``, numpy dot/matmul/einsum/tensordot) and the interleaved attention
matmuls are low precision, not widest/fp32; numpy ops are classified at all; numpy multi-input
ops are widest; optimizer updates, overflow checks and ops without tensor inputs are neutral
(never cast); box geometry and probability densities are fp32. ``_linalg_gemm``/``_linalg_gemm2``
stay fp32: their kernels are float32/float64 only on every device (MSHADOW_SGL_DBL_TYPE_SWITCH
in la_op.h), so float16 would fail on a GPU too.

On a CPU context the ops in NO_CPU_KERNEL stay float32 (MXNet has no fp16 CPU kernel for
them: "FP16 gemm on cpu not implemented!"), so a GPU script also runs on a laptop.

>>> DIFF_NEUTRAL['Dropout'], NEUTRAL['Dropout'], 'Dropout' in common.NEUTRAL
('', '', False)
"""
from mxamp.lists import common
# Re-exported: the full tables below hold them, and readers find them here as before.
from mxamp.lists.common import (R_BOX, R_CTRL, R_IMG, R_INT, R_LINALG, R_NOIN, R_NO_KERNEL, R_OPT,
                                R_PDF, R_QUANT, R_RAND, R_SG)

TARGET = "float16"

# Reasons only float16 uses.
R_LEAKY16 = ("elu/selu: exp of large inputs (as the reference); rrelu: NaN in float16 (probe); "
             "prelu: its float32 gamma must match the data's dtype")
R_SOFTRELU = "softrelu = log(1 + exp(x)) overflows in float16"

# Cast to float16: real low-precision kernels that pay off. bfloat16 computes all of these in
# float32: MXNet 1.9.1 has no bfloat16 CPU kernel for them (probe), only oneDNN's Convolution,
# Deconvolution and FullyConnected, which are common.
DIFF_LOW_PRECISION = {
    # Recurrent layers (cuDNN fp16 kernels)
    "RNN": "", "_npx_rnn": "",

    # Matrix products (tensor cores); the legacy and numpy spellings
    "dot": "", "_sparse_dot": "", "batch_dot": "", "_npx_batch_dot": "", "_np_dot": "",
    "_npi_matmul": "", "_npi_einsum": "", "_npi_tensordot": "", "_npi_tensordot_int_axes": "",

    # Transformer attention matmuls (missing from the reference's lists)
    "_contrib_interleaved_matmul_selfatt_qk": "",
    "_contrib_interleaved_matmul_selfatt_valatt": "", "_contrib_interleaved_matmul_encdec_qk": "",
    "_contrib_interleaved_matmul_encdec_valatt": "",
}

# Cast to float32: range- or precision-sensitive, or no float16 kernel.
DIFF_FP32 = {
    # Exponentials, logarithms and powers: overflow or lose too much in low precision
    # (range only: bfloat16 has float32's range; it computes square in float32 for speed)
    "square": "overflows fp16 above 256", "_sparse_square": "overflows fp16 above 256",
    "_npi_square": "overflows fp16 above 256",

    # No float16 kernel (bfloat16 has one: these are neutral there)
    "_contrib_BatchNormWithReLU": "oneDNN-only op: \"only supports MKL-DNN Backend\" for float16",
    "_npi_around": "\"Do not support `float16` as input\"",
}

# Multi-input ops: float inputs are cast to the widest float type among them. bfloat16 has no
# working CPU kernel for these (probe) and computes them in float32.
DIFF_WIDEST = {
    # NumPy-interface binary ops
    "_npi_true_divide": "", "_npi_arctan2": "",

    # Ops that combine a feature map with coordinates or a second map
    "Correlation": "", "BilinearSampler": "grid and data must share a dtype",
    "UpSampling": "bilinear mode takes a weight; nearest mode joins several inputs",
    "SpatialTransformer": "", "_contrib_ROIAlign": "rois are usually float32",
    "_contrib_RROIAlign": "", "ROIPooling": "", "_npx_roi_pooling": "",
    "_contrib_PSROIPooling": "",
}

# Run in the dtype their input already has; AMP never casts around them. bfloat16 has no
# working CPU kernel for these (probe: errors, a heap corruption for transpose) and computes
# them in float32; Pooling is conditional there (sum/lp pooling lacks a kernel).
DIFF_NEUTRAL = {
    # Shape, layout and copy ops
    "transpose": "", "im2col": "", "col2im": "", "Pad": "", "pad": "",

    # Slicing, splitting, indexing and gathering (indices keep their own dtype)
    "_contrib_bipartite_matching": "ordering only",

    # Activations
    "hard_sigmoid": "",

    # Pooling, resizing, dropout and batch norm (its gamma/beta/statistics stay float32)
    "Pooling": "", "_npx_pooling": "", "Pooling_v1": "", "Dropout": "", "_npx_dropout": "",

    # Tensor-scalar arithmetic and comparisons
    "_npi_true_divide_scalar": "",

    # Random samplers with tensor inputs
    "_random_exponential_like": R_RAND, "_random_gamma_like": R_RAND,
    "_random_generalized_negative_binomial_like": R_RAND,
    "_random_negative_binomial_like": R_RAND, "_random_normal_like": R_RAND,
    "_random_poisson_like": R_RAND, "_random_uniform_like": R_RAND,
    "_sample_multinomial": R_RAND, "sample_multinomial": R_RAND,
}

# float32 only when the parameter has one of the values; else the input's dtype.
# op name -> (parameter, [values], reason). The values are float16's range problems; bfloat16's
# conditions are the kernels it lacks instead.
DIFF_CONDITIONAL_FP32 = {
    "Activation": ("act_type", ["softrelu"], R_SOFTRELU),
    "_npx_activation": ("act_type", ["softrelu"], R_SOFTRELU),
    "LeakyReLU": ("act_type", ["elu", "selu", "rrelu", "prelu"], R_LEAKY16),
    "_npx_leaky_relu": ("act_type", ["elu", "selu", "rrelu", "prelu"], R_LEAKY16),
}

# The full tables: common.py's entries with the differences above in their place.
# LOSS_OUTPUT and FP32_PARAMS are common's (float16 states no table of its own).
(LOW_PRECISION, FP32, WIDEST, NEUTRAL, CONDITIONAL_FP32, LOSS_OUTPUT,
 FP32_PARAMS) = common.compose(
    low_precision=DIFF_LOW_PRECISION, fp32=DIFF_FP32, widest=DIFF_WIDEST, neutral=DIFF_NEUTRAL,
    conditional_fp32=DIFF_CONDITIONAL_FP32)

#: Why NO_CPU_KERNEL's ops compute in float32 on a CPU: the one wording, for every message.
NO_CPU_KERNEL_WHY = "MXNet has no float16 GEMM or convolution CPU kernel"

# Low-precision ops with no float16 CPU kernel ("FP16 gemm on cpu not implemented!",
# "only supports float32/float64 for CPU"): the patcher keeps them float32 on a CPU
# context. _npi_einsum has a float16 CPU kernel and is not listed.
NO_CPU_KERNEL = {
    "Convolution": "", "_npx_convolution": "", "Deconvolution": "", "_npx_deconvolution": "",
    "FullyConnected": "", "_npx_fully_connected": "", "_sparse_FullyConnected": "", "RNN": "",
    "_npx_rnn": "", "dot": "", "_sparse_dot": "", "batch_dot": "", "_npx_batch_dot": "",
    "_np_dot": "", "_npi_matmul": "", "_npi_tensordot": "", "_npi_tensordot_int_axes": "",
    "_contrib_interleaved_matmul_selfatt_qk": "",
    "_contrib_interleaved_matmul_selfatt_valatt": "", "_contrib_interleaved_matmul_encdec_qk": "",
    "_contrib_interleaved_matmul_encdec_valatt": "",
}

# float16 has no per-CPU-class differences: on every CPU mxamp computes it in float32 (see
# mxamp.precision.device_plan and NO_CPU_KERNEL above).
NO_KERNEL_BY_CPU_CLASS = {}
