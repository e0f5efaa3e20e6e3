"""Op-list facts both targets share, and the helper that builds a target's full tables.

Every forward operator registered in libmxnet 1.9.1 is classified once per target dtype, under
ALL of its names (aliases share one op handle and one category), in one of LOW_PRECISION, FP32,
WIDEST, NEUTRAL or CONDITIONAL_FP32. A value is a short reason ('' where the section comment
says it all); a CONDITIONAL_FP32 value is ``(parameter, [values], reason)``. Pure-backward
helpers (a ``backward`` word in the name, e.g. ``_backward_FullyConnected``,
``_split_v2_backward``) follow their forward op and are not listed. ``tests/test_lists.py``
checks coverage, disjointness, alias agreement and the facts the reasons state.

Each fact is stated once. This module holds what float16 and bfloat16 agree on: the reason
constants both use, every entry that is the same for both (same category, same reason, same
condition) and the LOSS_OUTPUT and FP32_PARAMS tables. :mod:`mxamp.lists.float16` and
:mod:`mxamp.lists.bfloat16` state only what differs from this module, and why (their
``DIFF_*`` tables), plus their CPU-kernel tables; :func:`compose` joins the two into the full
tables each target module exports (``LOW_PRECISION``, ``FP32``, ...), which is what
:func:`mxamp.lists.get_op_lists` reads. The tables here are therefore not a target's full
lists: an op the targets classify differently is in none of them.

``python -m mxamp.lists --explain OP`` tells where an op's entry comes from; ``--diff`` lists
the ops the two targets classify differently.

Why over 400 lines: it is a data table, one entry per registered operator (about 400 names
with their reasons); splitting it would scatter one classification over several files.

>>> 'Convolution' in LOW_PRECISION, 'dot' in LOW_PRECISION
(True, False)
"""
from collections import namedtuple

# Reasons shared by many entries (a target's own reasons live in its module).
R_BOX = "box coordinates in pixels: fp16/bf16 steps are too coarse for IoU and decoding"
R_CTRL = "control flow / graph container: the ops inside are classified themselves"
R_IMG = "image pre-processing: runs on the data pipeline's dtype"
R_INT = "integer-only kernel (bitwise/lcm): float casts would be wrong"
R_LINALG = "la_op kernels are float32/float64 only on every device in MXNet 1.9.1"
R_NOIN = "no tensor input: dtype comes from its dtype parameter (casts broke hybridized blocks)"
R_NO_KERNEL = "no float16/bfloat16 kernel in MXNet 1.9.1 (ci/probe_bf16_kernels.py)"
R_OPT = "optimizer/bookkeeping op: never cast (mp_* take fp16 weights beside fp32 masters)"
R_PDF = "probability density: exp/log of small values underflow in low precision"
R_QUANT = "quantization op: int8/uint8 flow; AMP must never touch it"
R_RAND = "random sampler: inputs are distribution parameters; runs in their dtype"
R_SG = "fused oneDNN op from graph partitioning: its precision is fixed there"

# Cast to the target dtype: real low-precision kernels that pay off.
LOW_PRECISION = {
    # Convolutions and fully connected layers
    "Convolution": "", "_npx_convolution": "", "Deconvolution": "", "_npx_deconvolution": "",
    "FullyConnected": "", "_npx_fully_connected": "", "_sparse_FullyConnected": "",
}

# Cast to float32: range- or precision-sensitive, or no low-precision kernel.
FP32 = {
    # Exponentials, logarithms and powers: overflow or lose too much in low precision
    "exp": "", "_sparse_exp": "", "expm1": "", "_sparse_expm1": "", "log": "", "_sparse_log": "",
    "log10": "", "_sparse_log10": "", "log2": "", "_sparse_log2": "", "log1p": "",
    "_sparse_log1p": "", "_npi_exp": "", "_npi_expm1": "", "_npi_log": "", "_npi_log10": "",
    "_npi_log2": "", "_npi_log1p": "", "reciprocal": "1/x is huge near 0",
    "_npi_reciprocal": "1/x is huge near 0", "_rdiv_scalar": "scalar / x overflows near 0",
    "_RDivScalar": "scalar / x overflows near 0",
    "_npi_rtrue_divide_scalar": "scalar / x overflows near 0", "rsqrt": "overflows near 0",
    "_sparse_rsqrt": "overflows near 0", "rcbrt": "overflows near 0", "_power": "", "_Power": "",
    "_power_scalar": "", "_PowerScalar": "", "_rpower_scalar": "", "_RPowerScalar": "",
    "broadcast_power": "", "_npi_power": "", "_npi_power_scalar": "", "_npi_rpower_scalar": "",
    "_hypot": "squares its inputs", "_Hypot": "squares its inputs",
    "_hypot_scalar": "squares its inputs", "_HypotScalar": "squares its inputs",
    "_npi_hypot_scalar": "squares its inputs", "broadcast_hypot": "squares its inputs",
    "_npi_hypot": "squares its inputs", "_npi_ldexp": "x * 2**y overflows",
    "_npi_ldexp_scalar": "x * 2**y overflows", "_npi_rldexp_scalar": "x * 2**y overflows",
    "_npi_polyval": "evaluates powers of x",

    # Trigonometric and hyperbolic functions with unbounded or steep outputs
    "tan": "", "_sparse_tan": "", "arcsin": "steep near +-1", "_sparse_arcsin": "steep near +-1",
    "arccos": "steep near +-1", "_sparse_arccos": "steep near +-1", "arctanh": "diverges at +-1",
    "_sparse_arctanh": "diverges at +-1", "sinh": "exp-based", "_sparse_sinh": "exp-based",
    "cosh": "exp-based", "_sparse_cosh": "exp-based", "_npi_tan": "",
    "_npi_arcsin": "steep near +-1", "_npi_arccos": "steep near +-1",
    "_npi_arctanh": "diverges at +-1", "_npi_sinh": "exp-based", "_npi_cosh": "exp-based",

    # Special functions
    "erf": "GELU's erf needs precision near +-1",
    "_npx_erf": "GELU's erf needs precision near +-1", "erfinv": "diverges at +-1",
    "_npx_erfinv": "diverges at +-1", "gamma": "grows factorially (float16 overflows above 8)",
    "_npx_gamma": "grows factorially (float16 overflows above 8)",
    "_sparse_gamma": "grows factorially (float16 overflows above 8)", "gammaln": "",
    "_npx_gammaln": "", "_sparse_gammaln": "",

    # Reductions: accumulate many values
    "sum": "", "_sparse_sum": "", "sum_axis": "", "mean": "", "_sparse_mean": "", "prod": "",
    "nansum": "", "nanprod": "", "norm": "", "_sparse_norm": "", "moments": "", "_square_sum": "",
    "khatri_rao": "product of many factors", "_np_sum": "", "_npi_mean": "", "_np_prod": "",
    "_np_product": "", "_npi_std": "", "_npi_var": "", "_npi_norm": "", "_np_trace": "",
    "_npi_average": "", "_npi_percentile": "", "_npi_bincount": "sums weights per bin",
    "_np_cumsum": "running sum grows without bound", "cumsum": "running sum grows without bound",

    # Softmax family: exp and a sum
    "softmax": "", "_npx_softmax": "", "log_softmax": "", "_npx_log_softmax": "", "softmin": "",
    "SoftmaxActivation": "",

    # Normalisation layers that compute statistics over the input
    "LayerNorm": "mean/variance over the feature axis",
    "_npx_layer_norm": "mean/variance over the feature axis", "GroupNorm": "", "InstanceNorm": "",
    "L2Normalization": "sum of squares", "LRN": "sum of squares over a window",
    "_contrib_SyncBatchNorm": "cross-device statistics; needs one dtype for data and parameters",

    # Losses and loss outputs (the gradient they start must not underflow)
    "SoftmaxOutput": "", "Softmax": "", "LinearRegressionOutput": "",
    "_sparse_LinearRegressionOutput": "", "LogisticRegressionOutput": "",
    "_sparse_LogisticRegressionOutput": "", "MAERegressionOutput": "",
    "_sparse_MAERegressionOutput": "", "SVMOutput": "", "softmax_cross_entropy": "",
    "smooth_l1": "", "_npx_smooth_l1": "", "MakeLoss": "", "make_loss": "",
    "_sparse_make_loss": "", "CTCLoss": "", "_contrib_ctc_loss": "", "_contrib_CTCLoss": "",
    "ctc_loss": "", "_contrib_hawkesll": "",
    "IdentityAttachKLSparseReg": "KL penalty averages activations",

    # Linear algebra (la_op kernels)
    "_linalg_gemm": R_LINALG, "linalg_gemm": R_LINALG, "_linalg_gemm2": R_LINALG,
    "linalg_gemm2": R_LINALG, "_linalg_det": R_LINALG, "linalg_det": R_LINALG,
    "_npi_det": R_LINALG, "_linalg_extractdiag": R_LINALG, "linalg_extractdiag": R_LINALG,
    "_linalg_extracttrian": R_LINALG, "linalg_extracttrian": R_LINALG, "_linalg_gelqf": R_LINALG,
    "linalg_gelqf": R_LINALG, "_linalg_inverse": R_LINALG, "linalg_inverse": R_LINALG,
    "_npi_inv": R_LINALG, "_linalg_makediag": R_LINALG, "linalg_makediag": R_LINALG,
    "_linalg_maketrian": R_LINALG, "linalg_maketrian": R_LINALG, "_linalg_potrf": R_LINALG,
    "linalg_potrf": R_LINALG, "_linalg_potri": R_LINALG, "linalg_potri": R_LINALG,
    "_linalg_slogdet": R_LINALG, "linalg_slogdet": R_LINALG, "_npi_slogdet": R_LINALG,
    "_linalg_sumlogdiag": R_LINALG, "linalg_sumlogdiag": R_LINALG, "_linalg_syevd": R_LINALG,
    "_linalg_syrk": R_LINALG, "linalg_syrk": R_LINALG, "_linalg_trmm": R_LINALG,
    "linalg_trmm": R_LINALG, "_linalg_trsm": R_LINALG, "linalg_trsm": R_LINALG,
    "_npi_cholesky": R_LINALG, "_npi_eig": R_LINALG, "_npi_eigh": R_LINALG,
    "_npi_eigvals": R_LINALG, "_npi_eigvalsh": R_LINALG, "_npi_pinv": R_LINALG,
    "_npi_pinv_scalar_rcond": R_LINALG, "_npi_solve": R_LINALG, "_npi_svd": R_LINALG,
    "_npi_tensorinv": R_LINALG, "_npi_tensorsolve": R_LINALG,

    # Fourier transforms and sketches: long sums
    "_contrib_fft": "", "_contrib_ifft": "", "_contrib_count_sketch": "",

    # Bounding-box geometry (detection heads and targets)
    "_contrib_box_nms": R_BOX, "_contrib_box_non_maximum_suppression": R_BOX,
    "_contrib_box_iou": R_BOX, "_contrib_box_encode": R_BOX, "_contrib_box_decode": R_BOX,
    "_contrib_MultiBoxDetection": R_BOX, "_npx_multibox_detection": R_BOX,
    "_contrib_MultiBoxPrior": R_BOX, "_npx_multibox_prior": R_BOX,
    "_contrib_MultiBoxTarget": R_BOX, "_npx_multibox_target": R_BOX, "_contrib_Proposal": R_BOX,
    "_contrib_MultiProposal": R_BOX,

    # Probability densities
    "_random_pdf_dirichlet": R_PDF, "random_pdf_dirichlet": R_PDF,
    "_random_pdf_exponential": R_PDF, "random_pdf_exponential": R_PDF, "_random_pdf_gamma": R_PDF,
    "random_pdf_gamma": R_PDF, "_random_pdf_generalized_negative_binomial": R_PDF,
    "random_pdf_generalized_negative_binomial": R_PDF, "_random_pdf_negative_binomial": R_PDF,
    "random_pdf_negative_binomial": R_PDF, "_random_pdf_normal": R_PDF, "random_pdf_normal": R_PDF,
    "_random_pdf_poisson": R_PDF, "random_pdf_poisson": R_PDF, "_random_pdf_uniform": R_PDF,
    "random_pdf_uniform": R_PDF,

    # Deformable and legacy convolutions without a verified low-precision kernel
    "_contrib_DeformableConvolution": "bilinear offset sampling needs precision",
    "_contrib_ModulatedDeformableConvolution": "bilinear offset sampling needs precision",
    "_contrib_DeformablePSROIPooling": "bilinear offset sampling needs precision",
    "Convolution_v1": "legacy op without a low-precision kernel",

    # Ops without float16 and bfloat16 kernels (both fail in ci/probe_bf16_kernels.py)
    "sort": "\"This operation does not support float16\"; no bfloat16 kernel either",
    "_npi_sort": "\"This operation does not support float16\"; no bfloat16 kernel either",
    "argsort": "\"This operation does not support float16\"; no bfloat16 kernel either",
    "_npi_argsort": "\"This operation does not support float16\"; no bfloat16 kernel either",
    "GridGenerator": "\"Other DTypes are not supported!\"",
    "Crop": "legacy op: float32 only (\"Unsupported data type\")",
    "fill_element_0index": R_NO_KERNEL,
    "BatchNorm_v1": "legacy op: no bfloat16 kernel; float16 needs uniform input dtypes",
    "SequenceLast": "wrong values for float16/bfloat16 data (probe: NaN or garbage)",
    "_contrib_quantize": "quantizes float32 input; a low-precision input must be cast first",
    "_contrib_quantize_v2": "accepts float32/int8/uint8 only (probe)",
    "_contrib_quantize_asym": "segfaults on float16/bfloat16 input (probe)",

    # Python-level custom operators (their code usually assumes float32 NumPy arrays)
    "Custom": "", "_npi_Custom": "", "_Native": "", "_NDArray": "",
}

# Multi-input ops: float inputs are cast to the widest float type among them.
WIDEST = {
    # Concatenation and stacking: inputs must share one dtype
    "Concat": "", "concat": "", "_sparse_concat": "", "stack": "", "add_n": "",
    "ElementWiseSum": "", "_sparse_add_n": "", "_sparse_ElementWiseSum": "",
    "_rnn_param_concat": "", "_npi_rnn_param_concat": "", "_npi_concatenate": "", "_npi_stack": "",
    "_npi_hstack": "", "_npi_vstack": "", "_npi_dstack": "", "_npi_column_stack": "",

    # Elementwise binary arithmetic (legacy elemwise_* and broadcast_*)
    "elemwise_add": "", "_add": "", "_Plus": "", "_plus": "", "_sparse_elemwise_add": "",
    "elemwise_sub": "", "_Minus": "", "_minus": "", "_sparse_elemwise_sub": "", "_sub": "",
    "elemwise_mul": "", "_Mul": "", "_mul": "", "_sparse_elemwise_mul": "", "elemwise_div": "",
    "_Div": "", "_div": "", "_sparse_elemwise_div": "", "_mod": "", "_Mod": "", "_maximum": "",
    "_Maximum": "", "_minimum": "", "_Minimum": "", "_scatter_elemwise_div": "",
    "broadcast_add": "", "broadcast_plus": "", "_sparse_broadcast_add": "",
    "_sparse_broadcast_plus": "", "broadcast_sub": "", "broadcast_minus": "",
    "_sparse_broadcast_minus": "", "_sparse_broadcast_sub": "", "broadcast_mul": "",
    "_sparse_broadcast_mul": "", "broadcast_div": "", "_sparse_broadcast_div": "",
    "broadcast_mod": "", "broadcast_maximum": "", "_npi_maximum": "", "broadcast_minimum": "",
    "_npi_minimum": "",

    # Elementwise comparisons and logic
    "_equal": "", "_Equal": "", "_not_equal": "", "_Not_Equal": "", "_greater": "", "_Greater": "",
    "_greater_equal": "", "_Greater_Equal": "", "_lesser": "", "_Lesser": "", "_lesser_equal": "",
    "_Lesser_Equal": "", "_logical_and": "", "_Logical_And": "", "_logical_or": "",
    "_Logical_Or": "", "_logical_xor": "", "_Logical_Xor": "", "broadcast_equal": "",
    "broadcast_not_equal": "", "broadcast_greater": "", "broadcast_greater_equal": "",
    "broadcast_lesser": "", "broadcast_lesser_equal": "", "broadcast_logical_and": "",
    "broadcast_logical_or": "", "broadcast_logical_xor": "", "_contrib_allclose": "",

    # NumPy-interface binary ops
    "_npi_add": "", "_npi_subtract": "", "_npi_multiply": "", "_npi_mod": "", "_npi_copysign": "",
    "_npi_equal": "", "_npi_not_equal": "", "_npi_greater": "", "_npi_greater_equal": "",
    "_npi_less": "", "_npi_less_equal": "",

    # Selection, assignment and insertion between tensors
    "where": "", "_sparse_where": "", "_npi_where": "", "_npi_where_lscalar": "",
    "_npi_where_rscalar": "", "_slice_assign": "", "_crop_assign": "", "_npi_slice_assign": "",
    "_scatter_set_nd": "", "_npi_scatter_set_nd": "", "_contrib_index_copy": "",
    "_npi_insert_scalar": "", "_npi_insert_slice": "", "_npi_insert_tensor": "",
    "_npi_boolean_mask_assign_tensor": "", "_npi_ediff1d": "to_begin/to_end join the output",

    # Ops that combine a feature map with coordinates or a second map
    "broadcast_like": "", "reshape_like": "", "_npx_reshape_like": "", "slice_like": "",
}

# Run in the dtype their input already has; AMP never casts around them.
NEUTRAL = {
    # Casts, copies and identities (AMP's own casts included)
    "Cast": "explicit user cast: must stay as written",
    "cast": "explicit user cast: must stay as written",
    "_npi_cast": "explicit user cast: must stay as written",
    "_npx_cast": "explicit user cast: must stay as written", "amp_cast": "AMP's own cast",
    "amp_multicast": "AMP's own cast", "_copy": "", "identity": "", "_np_copy": "", "_copyto": "",
    "_npi_copyto": "", "BlockGrad": "", "_sparse_stop_gradient": "", "stop_gradient": "",
    "_NoGradient": "", "_CrossDeviceCopy": "", "_set_value": "",
    "_identity_with_attr_like_rhs": "internal", "_grad_add": "internal gradient accumulation",
    "_zeros_without_dtype": "internal", "reset_arrays": "", "cast_storage": "",
    "_sparse_cast_storage": "", "_sparse_retain": "", "_contrib_getnnz": "",
    "_contrib_gradientmultiplier": "", "_contrib_round_ste": "", "_sparse__contrib_round_ste": "",
    "_contrib_sign_ste": "", "_sparse__contrib_sign_ste": "",

    # Shape, layout and copy ops
    "Reshape": "", "reshape": "", "Flatten": "", "flatten": "", "_npx_batch_flatten": "",
    "expand_dims": "", "_npi_expand_dims": "", "squeeze": "", "SwapAxis": "", "_npi_swapaxes": "",
    "swapaxes": "", "reverse": "", "flip": "", "tile": "", "_npi_tile": "", "repeat": "",
    "_np_repeat": "", "broadcast_to": "", "broadcast_axis": "", "broadcast_axes": "",
    "depth_to_space": "", "space_to_depth": "", "diag": "", "_np_reshape": "", "_npx_reshape": "",
    "_npi_reshape": "", "_np_squeeze": "", "_np_transpose": "", "_np_moveaxis": "", "_np_roll": "",
    "_npi_rot90": "", "_npi_flip": "", "_npi_broadcast_to": "", "_np_atleast_1d": "",
    "_np_atleast_2d": "", "_np_atleast_3d": "", "_np_diag": "", "_np_diagflat": "",
    "_np_diagonal": "", "_npi_tril": "", "_npi_pad": "",

    # Slicing, splitting, indexing and gathering (indices keep their own dtype)
    "slice": "", "crop": "", "_npi_slice": "", "_npx_slice": "", "_sparse_slice": "",
    "slice_axis": "", "_slice_assign_scalar": "", "_crop_assign_scalar": "",
    "_npi_slice_assign_scalar": "", "SliceChannel": "", "split": "", "_split_v2": "",
    "_npi_split": "", "_npi_hsplit": "", "_npi_dsplit": "", "take": "", "_npi_take": "",
    "batch_take": "", "pick": "", "choose_element_0index": "", "_npx_pick": "", "gather_nd": "",
    "_npi_gather_nd": "", "_npx_gather_nd": "", "scatter_nd": "", "_scatter_plus_scalar": "",
    "_scatter_minus_scalar": "", "one_hot": "", "_npx_one_hot": "", "_onehot_encode": "",
    "_contrib_boolean_mask": "", "_npi_boolean_mask": "", "_npi_boolean_mask_assign_scalar": "",
    "_npi_delete": "", "_npi_where_scalar2": "", "_contrib_index_array": "",
    "_contrib_arange_like": "", "_npx_arange_like": "", "shape_array": "", "_npx_shape_array": "",
    "size_array": "", "_npx_nonzero": "", "_npi_nonzero": "", "_npi_diag_indices_from": "",
    "_npi_unique": "", "_npx_constraint_check": "", "_npi_share_memory": "",
    "_ravel_multi_index": "", "ravel_multi_index": "", "_unravel_index": "", "unravel_index": "",
    "_npi_diff": "", "Embedding": "", "_npx_embedding": "", "_sparse_Embedding": "",
    "_contrib_SparseEmbedding": "", "_contrib_dgl_adjacency": "graph structure op",
    "_contrib_dgl_csr_neighbor_non_uniform_sample": "graph structure op",
    "_contrib_dgl_csr_neighbor_uniform_sample": "graph structure op",
    "_contrib_dgl_graph_compact": "graph structure op",
    "_contrib_dgl_subgraph": "graph structure op", "_contrib_edge_id": "graph structure op",
    "SequenceMask": "probed with float32 and low-precision lengths",
    "_npx_sequence_mask": "probed with float32 and low-precision lengths",
    "SequenceReverse": "probed with float32 and low-precision lengths",

    # Top-k, extrema and arg-extrema (rounding keeps the order)
    "topk": "", "_npx_topk": "", "max": "", "max_axis": "", "min": "", "min_axis": "",
    "argmax": "", "argmin": "", "argmax_channel": "", "_np_max": "", "_np_amax": "", "_np_min": "",
    "_np_amin": "", "_npi_argmax": "", "_npi_argmin": "", "_np_all": "", "_np_any": "",
    "_np_sometrue": "", "_histogram": "counts only", "_npi_histogram": "counts only",

    # Activations
    "relu": "", "_sparse_relu": "", "sigmoid": "", "_sparse_sigmoid": "", "tanh": "",
    "_sparse_tanh": "", "softsign": "", "_npx_relu": "", "_npx_sigmoid": "",
    "_contrib_quadratic": "",

    # Pooling, resizing, dropout and batch norm (its gamma/beta/statistics stay float32)
    "_contrib_AdaptiveAvgPooling2D": "", "_contrib_BilinearResize2D": "", "BatchNorm": "",
    "_npx_batch_norm": "", "_contrib_div_sqrt_dim": "",

    # Elementwise unary math that keeps its input's range
    "abs": "", "_sparse_abs": "", "negative": "", "_sparse_negative": "", "sign": "",
    "_sparse_sign": "", "ceil": "", "_sparse_ceil": "", "floor": "", "_sparse_floor": "",
    "round": "", "_sparse_round": "", "rint": "", "_sparse_rint": "", "fix": "", "_sparse_fix": "",
    "trunc": "", "_sparse_trunc": "", "clip": "", "_npi_clip": "", "_sparse_clip": "", "sqrt": "",
    "_sparse_sqrt": "", "cbrt": "", "_sparse_cbrt": "", "sin": "", "_sparse_sin": "", "cos": "",
    "_sparse_cos": "", "arctan": "", "_sparse_arctan": "", "arcsinh": "", "_sparse_arcsinh": "",
    "arccosh": "", "_sparse_arccosh": "", "degrees": "", "_sparse_degrees": "", "radians": "",
    "_sparse_radians": "", "logical_not": "", "_npi_absolute": "", "_npi_abs": "",
    "_npi_negative": "", "_npi_sign": "", "_npi_ceil": "", "_npi_floor": "", "_npi_rint": "",
    "_npi_fix": "", "_npi_trunc": "", "_npi_sqrt": "", "_npi_cbrt": "", "_npi_sin": "",
    "_npi_cos": "", "_npi_tanh": "", "_npi_arctan": "", "_npi_arcsinh": "", "_npi_arccosh": "",
    "_npi_degrees": "", "_npi_radians": "", "_npi_logical_not": "", "_npi_nan_to_num": "",
    "_npi_isnan": "", "_npi_isinf": "", "_npi_isfinite": "", "_npi_isposinf": "",
    "_npi_isneginf": "",

    # Tensor-scalar arithmetic and comparisons
    "_plus_scalar": "", "_PlusScalar": "", "_minus_scalar": "", "_MinusScalar": "",
    "_rminus_scalar": "", "_RMinusScalar": "", "_mul_scalar": "", "_MulScalar": "",
    "_div_scalar": "", "_DivScalar": "", "_mod_scalar": "", "_ModScalar": "", "_rmod_scalar": "",
    "_RModScalar": "", "_maximum_scalar": "", "_MaximumScalar": "", "_npi_maximum_scalar": "",
    "_minimum_scalar": "", "_MinimumScalar": "", "_npi_minimum_scalar": "", "_equal_scalar": "",
    "_EqualScalar": "", "_not_equal_scalar": "", "_NotEqualScalar": "", "_greater_scalar": "",
    "_GreaterScalar": "", "_greater_equal_scalar": "", "_GreaterEqualScalar": "",
    "_lesser_scalar": "", "_LesserScalar": "", "_lesser_equal_scalar": "",
    "_LesserEqualScalar": "", "_logical_and_scalar": "", "_LogicalAndScalar": "",
    "_logical_or_scalar": "", "_LogicalOrScalar": "", "_logical_xor_scalar": "",
    "_LogicalXorScalar": "", "_npi_add_scalar": "", "_npi_subtract_scalar": "",
    "_npi_rsubtract_scalar": "", "_npi_multiply_scalar": "", "_npi_mod_scalar": "",
    "_npi_rmod_scalar": "", "_npi_copysign_scalar": "", "_npi_rcopysign_scalar": "",
    "_npi_arctan2_scalar": "", "_npi_rarctan2_scalar": "", "_npi_equal_scalar": "",
    "_npi_not_equal_scalar": "", "_npi_greater_scalar": "", "_npi_greater_equal_scalar": "",
    "_npi_less_scalar": "", "_npi_less_equal_scalar": "",

    # Integer-only ops
    "_npi_bitwise_and": R_INT, "_npi_bitwise_or": R_INT, "_npi_bitwise_xor": R_INT,
    "_npi_bitwise_not": R_INT, "_npi_bitwise_and_scalar": R_INT, "_npi_bitwise_or_scalar": R_INT,
    "_npi_bitwise_xor_scalar": R_INT, "_npi_lcm": R_INT, "_npi_lcm_scalar": R_INT,

    # Ops with no tensor input (creation)
    "_zeros": R_NOIN, "_ones": R_NOIN, "_full": R_NOIN, "_npi_full": R_NOIN, "_arange": R_NOIN,
    "_linspace": R_NOIN, "_npi_linspace": R_NOIN, "_eye": R_NOIN, "_npi_zeros": R_NOIN,
    "_npi_ones": R_NOIN, "_npi_arange": R_NOIN, "_npi_eye": R_NOIN, "_npi_identity": R_NOIN,
    "_npi_indices": R_NOIN, "_npi_logspace": R_NOIN, "_npi_blackman": R_NOIN,
    "_npi_hamming": R_NOIN, "_npi_hanning": R_NOIN, "_cvimread": R_NOIN, "_npi_cvimread": R_NOIN,
    "_random_exponential": R_NOIN, "random_exponential": R_NOIN, "_random_gamma": R_NOIN,
    "random_gamma": R_NOIN, "_random_generalized_negative_binomial": R_NOIN,
    "random_generalized_negative_binomial": R_NOIN, "_random_negative_binomial": R_NOIN,
    "random_negative_binomial": R_NOIN, "_random_normal": R_NOIN, "normal": R_NOIN,
    "random_normal": R_NOIN, "_random_poisson": R_NOIN, "random_poisson": R_NOIN,
    "_random_randint": R_NOIN, "_npi_random_randint": R_NOIN, "random_randint": R_NOIN,
    "_random_uniform": R_NOIN, "random_uniform": R_NOIN, "uniform": R_NOIN,
    "_sample_unique_zipfian": R_NOIN,

    # Creation from another tensor's shape
    "zeros_like": "", "_sparse_zeros_like": "", "ones_like": "", "_npi_full_like": "",

    # Random samplers with tensor inputs
    "_sample_exponential": R_RAND, "sample_exponential": R_RAND, "_sample_gamma": R_RAND,
    "sample_gamma": R_RAND, "_sample_generalized_negative_binomial": R_RAND,
    "sample_generalized_negative_binomial": R_RAND, "_sample_negative_binomial": R_RAND,
    "sample_negative_binomial": R_RAND, "_sample_normal": R_RAND, "sample_normal": R_RAND,
    "_sample_poisson": R_RAND, "sample_poisson": R_RAND, "_sample_uniform": R_RAND,
    "sample_uniform": R_RAND, "_shuffle": R_RAND, "_npi_shuffle": R_RAND, "shuffle": R_RAND,
    "_npi_uniform": R_RAND, "_npi_uniform_n": R_RAND, "_npi_normal": R_RAND,
    "_npi_normal_n": R_RAND, "_npi_gamma": R_RAND, "_npi_exponential": R_RAND,
    "_npi_bernoulli": R_RAND, "_npi_choice": R_RAND, "_npi_multinomial": R_RAND,
    "_npi_pareto": R_RAND, "_npi_powerd": R_RAND, "_npi_rayleigh": R_RAND, "_npi_weibull": R_RAND,
    "_npi_gumbel": R_RAND, "_npi_logistic": R_RAND,

    # Optimizer updates and overflow checks
    "sgd_update": R_OPT, "_sparse_sgd_update": R_OPT, "sgd_mom_update": R_OPT,
    "_sparse_sgd_mom_update": R_OPT, "mp_sgd_update": R_OPT, "mp_sgd_mom_update": R_OPT,
    "multi_sgd_update": R_OPT, "multi_sgd_mom_update": R_OPT, "multi_mp_sgd_update": R_OPT,
    "multi_mp_sgd_mom_update": R_OPT, "preloaded_multi_sgd_update": R_OPT,
    "preloaded_multi_sgd_mom_update": R_OPT, "preloaded_multi_mp_sgd_update": R_OPT,
    "preloaded_multi_mp_sgd_mom_update": R_OPT, "nag_mom_update": R_OPT,
    "mp_nag_mom_update": R_OPT, "adam_update": R_OPT, "_sparse_adam_update": R_OPT,
    "_adamw_update": R_OPT, "_mp_adamw_update": R_OPT, "_multi_adamw_update": R_OPT,
    "_multi_mp_adamw_update": R_OPT, "lamb_update_phase1": R_OPT, "lamb_update_phase2": R_OPT,
    "mp_lamb_update_phase1": R_OPT, "mp_lamb_update_phase2": R_OPT, "_multi_lamb_update": R_OPT,
    "_multi_mp_lamb_update": R_OPT, "ftml_update": R_OPT, "ftrl_update": R_OPT,
    "_sparse_ftrl_update": R_OPT, "rmsprop_update": R_OPT, "rmspropalex_update": R_OPT,
    "signsgd_update": R_OPT, "signum_update": R_OPT, "_sparse_adagrad_update": R_OPT,
    "_contrib_group_adagrad_update": R_OPT, "multi_lars": R_OPT, "multi_sum_sq": R_OPT,
    "all_finite": R_OPT, "multi_all_finite": R_OPT,

    # Image decoding and augmentation
    "_image_adjust_lighting": R_IMG, "_npx__image_adjust_lighting": R_IMG, "_image_crop": R_IMG,
    "_npx__image_crop": R_IMG, "_image_flip_left_right": R_IMG,
    "_npx__image_flip_left_right": R_IMG, "_image_flip_top_bottom": R_IMG,
    "_npx__image_flip_top_bottom": R_IMG, "_image_normalize": R_IMG,
    "_npx__image_normalize": R_IMG, "_image_random_brightness": R_IMG,
    "_npx__image_random_brightness": R_IMG, "_image_random_color_jitter": R_IMG,
    "_npx__image_random_color_jitter": R_IMG, "_image_random_contrast": R_IMG,
    "_npx__image_random_contrast": R_IMG, "_image_random_flip_left_right": R_IMG,
    "_npx__image_random_flip_left_right": R_IMG, "_image_random_flip_top_bottom": R_IMG,
    "_npx__image_random_flip_top_bottom": R_IMG, "_image_random_hue": R_IMG,
    "_npx__image_random_hue": R_IMG, "_image_random_lighting": R_IMG,
    "_npx__image_random_lighting": R_IMG, "_image_random_saturation": R_IMG,
    "_npx__image_random_saturation": R_IMG, "_image_resize": R_IMG, "_npx__image_resize": R_IMG,
    "_image_to_tensor": R_IMG, "_npx__image_to_tensor": R_IMG, "_cvimdecode": R_IMG,
    "_npi_cvimdecode": R_IMG, "_cvimresize": R_IMG, "_npi_cvimresize": R_IMG,
    "_cvcopyMakeBorder": R_IMG, "_imdecode": R_IMG,

    # Quantization (int8 inference)
    "_contrib_dequantize": R_QUANT, "_contrib_requantize": R_QUANT,
    "_contrib_calibrate_entropy": R_QUANT, "_contrib_quantized_act": R_QUANT,
    "_contrib_quantized_batch_norm": R_QUANT, "_contrib_quantized_concat": R_QUANT,
    "_contrib_quantized_conv": R_QUANT, "_contrib_quantized_elemwise_add": R_QUANT,
    "_contrib_quantized_elemwise_mul": R_QUANT, "_contrib_quantized_embedding": R_QUANT,
    "_contrib_quantized_flatten": R_QUANT, "_contrib_quantized_fully_connected": R_QUANT,
    "_contrib_quantized_pooling": R_QUANT, "_contrib_quantized_rnn": R_QUANT,

    # Fused oneDNN subgraph ops, control flow and graph containers
    "_sg_mkldnn_conv": R_SG, "_sg_mkldnn_fully_connected": R_SG, "_sg_mkldnn_selfatt_qk": R_SG,
    "_sg_mkldnn_selfatt_valatt": R_SG, "_foreach": R_CTRL, "_while_loop": R_CTRL, "_cond": R_CTRL,
    "_CachedOp": R_CTRL, "_CachedOpThreadSafe": R_CTRL,
    "_CustomFunction": "autograd.Function: user code sees the dtypes it was given",
}

# float32 only when the parameter has one of the values; else the input's dtype.
# op name -> (parameter, [values], reason). The targets agree on no condition (float16's are
# range problems, bfloat16's missing kernels), so each target module states its own.
CONDITIONAL_FP32 = {}

# Loss outputs with a ``grad_scale`` parameter: the loss scale multiplies it.
LOSS_OUTPUT = {
    "SoftmaxOutput": "", "Softmax": "", "LinearRegressionOutput": "",
    "_sparse_LinearRegressionOutput": "", "LogisticRegressionOutput": "",
    "_sparse_LogisticRegressionOutput": "", "MAERegressionOutput": "",
    "_sparse_MAERegressionOutput": "", "MakeLoss": "",
}

# op -> input names that stay float32 when the op runs in low precision. BatchNorm is NEUTRAL
# (its kernels take low-precision data beside float32 gamma/beta/statistics), so these entries
# only matter when a user moves it to low precision with init(target_precision_ops=...);
# they also keep list_lp16_use_fp32_params() shaped like the reference's.
FP32_PARAMS = {
    "BatchNorm": ("gamma", "beta", "moving_mean", "moving_var"),
    "_npx_batch_norm": ("gamma", "beta", "moving_mean", "moving_var"),
    "_contrib_BatchNormWithReLU": ("gamma", "beta", "moving_mean", "moving_var"),
}


# ------------------------------------------------------------------ composing a target's tables
#: The category tables, in the order of :data:`Tables`' first five fields.
CATEGORY_TABLES = ("LOW_PRECISION", "FP32", "WIDEST", "NEUTRAL", "CONDITIONAL_FP32")

#: A target's full tables, as :func:`compose` returns them.
Tables = namedtuple("Tables", "low_precision fp32 widest neutral conditional_fp32 "
                              "loss_output fp32_params")


def compose(low_precision=None, fp32=None, widest=None, neutral=None, conditional_fp32=None,
            loss_output=None, fp32_params=None):
    """A target's full tables: this module's entries joined with the target's differences.

    The first five arguments are the target's own category entries (its ``DIFF_*`` tables).
    An op named in any of them leaves every category of this module and takes its new entry
    there, so a difference always wins. ``loss_output`` and ``fp32_params``, when given,
    replace this module's table of that name. The dicts returned are new ones: no target
    shares a mutable table with this module or with the other target.

    >>> tables = compose(fp32={'Convolution': 'example'})
    >>> 'Convolution' in tables.low_precision, tables.fp32['Convolution']
    (False, 'example')
    >>> tables.loss_output == LOSS_OUTPUT and tables.loss_output is not LOSS_OUTPUT
    True
    """
    diffs = [d or {} for d in (low_precision, fp32, widest, neutral, conditional_fp32)]
    moved = {}
    for table, diff in zip(CATEGORY_TABLES, diffs):
        for op in diff:
            if op in moved:  # a target must not put one op in two categories
                raise ValueError("%r is in both %s and %s" % (op, moved[op], table))
            moved[op] = table
    shared = (LOW_PRECISION, FP32, WIDEST, NEUTRAL, CONDITIONAL_FP32)
    full = [{**{op: v for op, v in common.items() if op not in moved}, **diff}
            for common, diff in zip(shared, diffs)]
    full.append(dict(LOSS_OUTPUT if loss_output is None else loss_output))
    full.append(dict(FP32_PARAMS if fp32_params is None else fp32_params))
    return Tables(*full)


def lookup(op, module, prefix=""):
    """``(table name, entry)`` of ``op`` in a module's category tables, or None if it has none.

    ``module`` is this module or a target module; ``prefix='DIFF_'`` reads a target module's
    differences instead of its full tables.

    >>> import mxamp.lists.common as common
    >>> lookup('Convolution', common)
    ('LOW_PRECISION', '')
    >>> from mxamp.lists import bfloat16
    >>> lookup('_contrib_BatchNormWithReLU', bfloat16, 'DIFF_')[0]
    'NEUTRAL'
    >>> lookup('_contrib_BatchNormWithReLU', common) is None
    True
    """
    for table in CATEGORY_TABLES:
        entries = getattr(module, prefix + table, {})
        if op in entries:
            return table, entries[op]
    return None
