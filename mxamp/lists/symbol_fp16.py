"""``mxnet.contrib.amp.lists.symbol_fp16``'s lists, made from mxamp's float16 data.

For code written for the reference: ``amp.lists.symbol_fp16.FP16_FUNCS`` and the other
lists below have the reference's names and shapes. They are live: names appended to (or
removed from) a list before ``amp.init``, or lists passed to ``convert_*``, take effect as in
the reference (see :mod:`mxamp.lists.reference_view`).

>>> 'FullyConnected' in FP16_FUNCS and ('Activation', 'act_type', ['softrelu']) in \\
...     CONDITIONAL_FP32_FUNCS
True
"""
from mxamp.lists.reference_view import reference_lists as _reference_lists

_LISTS = _reference_lists("float16")
#: Ops run in float16.
FP16_FUNCS = _LISTS["FP16_FUNCS"]
#: Ops that run in their input's dtype (float16 or float32).
FP16_FP32_FUNCS = _LISTS["FP16_FP32_FUNCS"]
#: Ops run in float32.
FP32_FUNCS = _LISTS["FP32_FUNCS"]
#: ``(op, parameter, [values])``: float32 when the parameter has one of the values.
CONDITIONAL_FP32_FUNCS = _LISTS["CONDITIONAL_FP32_FUNCS"]
#: Multi-input ops run in the widest float type among their inputs.
WIDEST_TYPE_CASTS = _LISTS["WIDEST_TYPE_CASTS"]
#: Loss-output ops whose gradient follows the loss scale.
LOSS_OUTPUT_FUNCTIONS = _LISTS["LOSS_OUTPUT_FUNCTIONS"]
#: Copies of the lists as made, to tell what a user changed.
ORIGINALS = _reference_lists("float16")
