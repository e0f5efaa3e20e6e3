"""Graph conversion for low-precision inference. (Stub: issue #4.)"""


def convert_symbol(sym, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=False):
    """Convert an fp32 Symbol into a mixed-precision Symbol."""
    raise NotImplementedError("convert_symbol lands with the conversion issue (#4)")


def convert_model(sym, arg_params, aux_params, target_dtype="float16", target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=False):
    """Convert a Symbol and its parameters."""
    raise NotImplementedError("convert_model lands with the conversion issue (#4)")


def convert_hybrid_block(block, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False):
    """Convert a HybridBlock into a mixed-precision SymbolBlock."""
    raise NotImplementedError("convert_hybrid_block lands with the conversion issue (#4)")


def convert_bucketing_module(bucketing_mod, target_dtype="float16", target_dtype_ops=None,
                             fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                             cast_optional_params=False):
    """Convert every bucket of a BucketingModule."""
    raise NotImplementedError("convert_bucketing_module lands with the conversion issue (#4)")
