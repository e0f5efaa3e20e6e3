"""Input recipes for ci/probe_bf16_kernels.py: how to call each operator with small tensors.

Ops without a recipe get generic ones built from their signature (``_generic_recipes``). A
recipe names the dtype role of every input, so the probe can feed parameters and indices in
float32 beside low-precision data, as networks do.
"""
import re

from mxamp.backend.registry import op_info

# ---------------------------------------------------------------------------------------------
# Input recipes. An input spec is (kind, shape[, extra]):
#   'f'  float in [0.5, 1.5), given in the probed dtype      'n'  float in [-1, 1), probed dtype
#   'F'  float in [0.5, 1.5), ALWAYS float32 (parameters, statistics, lengths kept fp32)
#   'i'  integers in [0, extra) stored as float32 (indices as networks usually feed them)
#   'I'  integers in [0, extra) stored as int32
#   'b'  0/1 values in the probed dtype (conditions, masks)
# A recipe is (inputs, kwargs). Ops without a recipe get generic ones built from their
# signature: every tensor input 'n' of shape (6, 8), then of shape (2, 3, 4, 5).
# ---------------------------------------------------------------------------------------------
S2, S4 = (6, 8), (2, 3, 4, 5)
IMG = (2, 3, 8, 8)


def _r(*inputs, **kwargs):
    return (list(inputs), kwargs)


RECIPES = {
    # GEMMs and convolutions
    "Convolution": [_r(("n", IMG), ("n", (4, 3, 3, 3)), ("n", (4,)), kernel=(3, 3), num_filter=4)],
    "Deconvolution": [_r(("n", IMG), ("n", (3, 4, 3, 3)), ("n", (4,)), kernel=(3, 3),
                         num_filter=4, no_bias=False)],
    "FullyConnected": [_r(("n", S2), ("n", (5, 8)), ("n", (5,)), num_hidden=5),
                       _r(("n", S4), ("n", (5, 60)), ("n", (5,)), num_hidden=5)],
    "RNN": [_r(("n", (5, 2, 4)), ("n", (4 * 8 * (4 + 8 + 2),)), ("n", (1, 2, 8)),
               ("n", (1, 2, 8)), state_size=8, num_layers=1, mode="lstm")],
    "dot": [_r(("n", S2), ("n", (8, 5)))],
    "batch_dot": [_r(("n", (2, 6, 8)), ("n", (2, 8, 5)))],
    "_linalg_gemm": [_r(("n", S2), ("n", (8, 5)), ("n", (6, 5)))],
    "_linalg_gemm2": [_r(("n", S2), ("n", (8, 5)))],
    "_np_dot": [_r(("n", S2), ("n", (8, 5)))],
    "_npi_matmul": [_r(("n", (2, 6, 8)), ("n", (2, 8, 5)))],
    "_npi_tensordot": [_r(("n", S2), ("n", (8, 5)), a_axes_summed=(1,), b_axes_summed=(0,))],
    "_npi_tensordot_int_axes": [_r(("n", S2), ("n", (8, 5)), axes=1)],
    "_npi_einsum": [_r(("n", S2), ("n", (8, 5)), num_args=2, subscripts="ij,jk->ik")],
    "_contrib_interleaved_matmul_selfatt_qk": [_r(("n", (5, 2, 3 * 8)), heads=2)],
    "_contrib_interleaved_matmul_selfatt_valatt": [_r(("n", (5, 2, 3 * 8)), ("n", (4, 5, 5)),
                                                      heads=2)],
    "_contrib_interleaved_matmul_encdec_qk": [_r(("n", (5, 2, 8)), ("n", (6, 2, 16)), heads=2)],
    "_contrib_interleaved_matmul_encdec_valatt": [_r(("n", (6, 2, 16)), ("n", (4, 5, 6)),
                                                     heads=2)],
    "_contrib_DeformableConvolution": [_r(("n", IMG), ("n", (2, 18, 6, 6)), ("n", (4, 3, 3, 3)),
                                          kernel=(3, 3), num_filter=4, no_bias=True)],
    "_contrib_ModulatedDeformableConvolution": [
        _r(("n", IMG), ("n", (2, 18, 6, 6)), ("f", (2, 9, 6, 6)), ("n", (4, 3, 3, 3)),
           kernel=(3, 3), num_filter=4, no_bias=True)],
    # normalisation, pooling, activations (parameters and statistics stay float32)
    "BatchNorm": [_r(("n", IMG), ("F", (3,)), ("F", (3,)), ("F", (3,)), ("F", (3,)))],
    "_contrib_BatchNormWithReLU": [_r(("n", IMG), ("F", (3,)), ("F", (3,)), ("F", (3,)),
                                      ("F", (3,)))],
    "_contrib_SyncBatchNorm": [_r(("n", IMG), ("F", (3,)), ("F", (3,)), ("F", (3,)),
                                  ("F", (3,)), key="probe")],
    "LayerNorm": [_r(("n", S2), ("F", (8,)), ("F", (8,)))],
    "GroupNorm": [_r(("n", IMG), ("F", (1,)), ("F", (1,)))],
    "InstanceNorm": [_r(("n", IMG), ("F", (3,)), ("F", (3,)))],
    "Pooling": [_r(("n", IMG), kernel=(2, 2), pool_type=t, stride=(2, 2))
                for t in ("max", "avg", "sum")] + [
                    _r(("n", IMG), kernel=(2, 2), pool_type="lp", p_value=2, stride=(2, 2)),
                    _r(("n", IMG), global_pool=True,
                                                             kernel=(1, 1), pool_type="avg")],
    "Pooling_v1": [_r(("n", IMG), kernel=(2, 2), pool_type="max")],
    "_contrib_AdaptiveAvgPooling2D": [_r(("n", IMG), output_size=(2, 2))],
    "Activation": [_r(("n", S4), act_type=t) for t in
                   ("relu", "sigmoid", "softrelu", "softsign", "tanh")],
    "LeakyReLU": [_r(("n", S4), act_type=t) for t in ("leaky", "elu", "selu", "gelu", "rrelu")]
                 + [_r(("n", S4), ("F", (3,)), act_type="prelu")],
    "LRN": [_r(("f", IMG), nsize=3)],
    "L2Normalization": [_r(("n", IMG))],
    "Dropout": [_r(("n", S4), p=0.5)],
    "UpSampling": [_r(("n", IMG), scale=2, sample_type="nearest", num_args=1)],
    "_contrib_BilinearResize2D": [_r(("n", IMG), height=4, width=4)],
    "Embedding": [_r(("i", (4, 5), 20), ("n", (20, 16)), input_dim=20, output_dim=16),
                  _r(("i", (64,), 1000), ("n", (1000, 64)), input_dim=1000, output_dim=64)],
    "_contrib_SparseEmbedding": [_r(("i", (4, 5), 20), ("n", (20, 16)), input_dim=20,
                                    output_dim=16)],
    # shape and indexing
    "Reshape": [_r(("n", S2), shape=(8, 6)), _r(("n", S4), shape=(0, -1))],
    "_np_reshape": [_r(("n", S2), newshape=(8, 6))],
    "_npx_reshape": [_r(("n", S4), newshape=(-2, -1))],
    "expand_dims": [_r(("n", S2), axis=1), _r(("n", S4), axis=0)],
    "transpose": [_r(("n", S2)), _r(("n", S4)), _r(("n", S4), axes=(0, 2, 1, 3))],
    "_np_transpose": [_r(("n", S2)), _r(("n", S4)), _r(("n", S4), axes=(0, 2, 1, 3))],
    "SwapAxis": [_r(("n", S2), dim1=0, dim2=1), _r(("n", S4), dim1=1, dim2=2)],
    "_np_moveaxis": [_r(("n", S4), source=0, destination=2)],
    "_np_roll": [_r(("n", S2), shift=1, axis=0)],
    "_npi_rot90": [_r(("n", S2), k=1, axes=(0, 1))],
    "_npi_flip": [_r(("n", S2), axis=0)],
    "reverse": [_r(("n", S2), axis=0), _r(("n", S4), axis=1)],
    "tile": [_r(("n", S2), reps=(2, 1))],
    "repeat": [_r(("n", S2), repeats=2, axis=0)],
    "broadcast_to": [_r(("n", (1, 8)), shape=(6, 8))],
    "_npi_broadcast_to": [_r(("n", (1, 8)), shape=(6, 8))],
    "broadcast_axis": [_r(("n", (1, 8)), axis=0, size=6)],
    "depth_to_space": [_r(("n", (2, 4, 3, 3)), block_size=2)],
    "space_to_depth": [_r(("n", (2, 1, 4, 4)), block_size=2)],
    "slice": [_r(("n", S2), begin=(1, 2), end=(4, 6)), _r(("n", S4), begin=(0, 1), end=(2, 3))],
    "slice_axis": [_r(("n", S2), axis=1, begin=1, end=5)],
    "slice_like": [_r(("n", S2), ("n", (3, 4)))],
    "_slice_assign": [_r(("n", S2), ("n", (3, 4)), begin=(0, 0), end=(3, 4))],
    "_slice_assign_scalar": [_r(("n", S2), begin=(0, 0), end=(3, 4), scalar=2.0)],
    "SliceChannel": [_r(("n", S2), num_outputs=2, axis=1), _r(("n", S4), num_outputs=3, axis=1)],
    "_split_v2": [_r(("n", S2), indices=(0, 3), axis=1)],
    "_npi_hsplit": [_r(("n", S2), indices=(0, 4), axis=1)],
    "_npi_dsplit": [_r(("n", (2, 3, 4)), indices=(0, 2), axis=2)],
    "take": [_r(("n", S2), ("i", (5,), 6)), _r(("n", S4), ("i", (3,), 2))],
    "batch_take": [_r(("n", S2), ("I", (6,), 8))],
    "pick": [_r(("n", S2), ("i", (6,), 8), axis=1)],
    "gather_nd": [_r(("n", S2), ("i", (2, 3), 6))],
    "scatter_nd": [_r(("n", (3,)), ("i", (2, 3), 6), shape=(6, 8))],
    "_scatter_set_nd": [_r(("n", S2), ("n", (3,)), ("i", (2, 3), 6), shape=(6, 8))],
    "one_hot": [_r(("i", (5,), 4), depth=4)],
    "Pad": [_r(("n", IMG), mode="constant", pad_width=(0, 0, 0, 0, 1, 1, 1, 1)),
            _r(("n", IMG), mode="edge", pad_width=(0, 0, 0, 0, 1, 1, 1, 1))],
    "_npi_pad": [_r(("n", S2), pad_width=((1, 1), (2, 2)), mode="constant")],
    "Crop": [_r(("n", IMG), h_w=(4, 4), num_args=1)],
    "SequenceMask": [_r(("n", (5, 2, 3)), ("F", (2,)), use_sequence_length=True),
                     _r(("n", (5, 2, 3)))],
    "SequenceLast": [_r(("n", (5, 2, 3)), ("F", (2,)), use_sequence_length=True)],
    "SequenceReverse": [_r(("n", (5, 2, 3)), ("F", (2,)), use_sequence_length=True)],
    "where": [_r(("b", S2), ("n", S2), ("n", S2))],
    "_npi_where": [_r(("b", S2), ("n", S2), ("n", S2))],
    "_npi_where_lscalar": [_r(("b", S2), ("n", S2), scalar=1.0)],
    "_npi_where_rscalar": [_r(("b", S2), ("n", S2), scalar=1.0)],
    "_npi_where_scalar2": [_r(("b", S2), x=1.0, y=2.0)],
    "_contrib_boolean_mask": [_r(("n", S2), ("b", (6,)))],
    "_contrib_index_copy": [_r(("n", S2), ("I", (2,), 6), ("n", (2, 8)))],
    "fill_element_0index": [_r(("n", S2), ("n", (6,)), ("i", (6,), 8))],
    "broadcast_like": [_r(("n", (1, 8)), ("n", S2))],
    "reshape_like": [_r(("n", S2), ("n", (8, 6)))],
    "Concat": [_r(("n", S2), ("n", S2), num_args=2, dim=1), _r(("n", S4), ("n", S4), num_args=2)],
    "stack": [_r(("n", S2), ("n", S2), num_args=2, axis=0)],
    "add_n": [_r(("n", S2), ("n", S2), num_args=2)],
    "_npi_concatenate": [_r(("n", S2), ("n", S2), num_args=2, axis=0)],
    "_npi_stack": [_r(("n", S2), ("n", S2), num_args=2, axis=0)],
    "_rnn_param_concat": [_r(("n", (6,)), ("n", (8,)), num_args=2, dim=0)],
    "_npi_insert_scalar": [_r(("n", (6,)), ("n", (1,)), int_ind=1, axis=0)],
    "_npi_insert_slice": [_r(("n", (6,)), ("n", (2,)), start=1, stop=3, step=1, axis=0)],
    "_npi_insert_tensor": [_r(("n", (6,)), ("n", (2,)), ("I", (2,), 6), axis=0)],
    "_npi_delete": [_r(("n", (6,)), ("I", (2,), 6), axis=0)],
    "_npi_boolean_mask_assign_scalar": [_r(("n", (6,)), ("b", (6,)), value=1.0)],
    "_npi_boolean_mask_assign_tensor": [_r(("n", (6,)), ("b", (6,)), ("n", (1,)))],
    "_npi_diff": [_r(("n", S2), n=1, axis=1)],
    "_npi_around": [_r(("n", S2), decimals=1)],
    "_npi_tril": [_r(("n", S2), k=0)],
    "diag": [_r(("n", S2))],
    "_np_diag": [_r(("n", S2))],
    "_np_diagonal": [_r(("n", S2))],
    "_np_diagflat": [_r(("n", (4,)))],
    "_np_squeeze": [_r(("n", (6, 1, 8)))],
    "squeeze": [_r(("n", (6, 1, 8)))],
    "topk": [_r(("n", S2), k=2, ret_typ="value"), _r(("n", S2), k=2, ret_typ="indices")],
    "sort": [_r(("n", S2))],
    "argsort": [_r(("n", S2))],
    "clip": [_r(("n", S2), a_min=-0.5, a_max=0.5)],
    "_contrib_quadratic": [_r(("n", S2), a=1.0, b=2.0, c=3.0)],
    "_contrib_div_sqrt_dim": [_r(("n", S2))],
    "Cast": [_r(("n", S2), dtype="float32")],
    "amp_cast": [_r(("n", S2), dtype="float32")],
    "amp_multicast": [_r(("n", S2), ("n", S2), num_outputs=2)],
    "_contrib_ROIAlign": [_r(("n", IMG), ("n", (2, 5)), pooled_size=(2, 2), spatial_scale=1.0)],
    "ROIPooling": [_r(("n", IMG), ("f", (2, 5)), pooled_size=(2, 2), spatial_scale=1.0)],
    "_contrib_RROIAlign": [_r(("n", IMG), ("f", (2, 6)), pooled_size=(2, 2), spatial_scale=1.0)],
    "_contrib_PSROIPooling": [_r(("n", (2, 8, 8, 8)), ("f", (2, 5)), spatial_scale=1.0,
                                 output_dim=2, pooled_size=2)],
    "SpatialTransformer": [_r(("n", IMG), ("n", (2, 6)), target_shape=(4, 4),
                              transform_type="affine", sampler_type="bilinear")],
    "BatchNorm_v1": [_r(("n", IMG), ("F", (3,)), ("F", (3,)), ("F", (3,)), ("F", (3,)))],
    "cast_storage": [_r(("n", S2), stype="default")],
    "_ravel_multi_index": [_r(("i", (2, 3), 4), shape=(4, 5))],
    "_unravel_index": [_r(("i", (4,), 20), shape=(4, 5))],
    "_contrib_bipartite_matching": [_r(("n", S2), threshold=0.1)],
    "_histogram": [_r(("n", (20,)), bin_cnt=4, range=(-1, 1))],
    "GridGenerator": [_r(("n", (2, 6)), transform_type="affine", target_shape=(4, 4))],
    "BilinearSampler": [_r(("n", IMG), ("n", (2, 2, 4, 4)))],
    "im2col": [_r(("n", IMG), kernel=(3, 3))],
    "col2im": [_r(("n", (2, 27, 36)), output_size=(8, 8), kernel=(3, 3))],
    "_contrib_box_nms": [_r(("f", (1, 6, 6)))],
    "_contrib_box_iou": [_r(("f", (3, 4)), ("f", (2, 4)))],
    "_npi_full_like": [_r(("n", S2), fill_value=2.0)],
    "_contrib_arange_like": [_r(("n", S2))],
}

GENERIC_SHAPES = (S2, S4)
SCALAR_KW = {"scalar": 0.75}

#: Ops whose output is random: only dtype and shape are compared, not values.
RANDOM_OP = re.compile(r"random|sample|shuffle|dropout|bernoulli|choice|multinomial|"
                       r"^_npi_(normal|uniform|gamma|exponential|pareto|powerd|rayleigh|"
                       r"weibull|gumbel|logistic)", re.IGNORECASE)


def _generic_recipes(name):
    info = op_info(name)
    args, kv_name = list(info.arguments), info.key_var_num_args
    tensors = [a for a, t in args if t.startswith("NDArray-or-Symbol")]
    variadic = any(t.startswith("NDArray-or-Symbol[]") for _, t in args)
    if not tensors:
        return []
    recipes = []
    # Trailing inputs may be optional (softmax's ``length``): also try with fewer of them.
    for count in ([2] if variadic else range(len(tensors), 0, -1)):
        kwargs = {}
        if kv_name:
            kwargs[kv_name] = count
        if any(a == "scalar" for a, _ in args):
            kwargs.update(SCALAR_KW)
        # Samplers loop forever on negative rates: feed them positive values.
        kind = "f" if RANDOM_OP.search(name) else "n"
        recipes += [([(kind, shape)] * count, dict(kwargs)) for shape in GENERIC_SHAPES]
    return recipes


def recipes_for(name, canonical):
    """The recipes for one op: its own from :data:`RECIPES`, else generic ones."""
    return RECIPES.get(canonical) or RECIPES.get(name) or _generic_recipes(name)
