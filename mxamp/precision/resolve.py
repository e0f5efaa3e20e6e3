"""The one resolver of op lists: mxamp's data, the reference's module edits, a caller's overrides.

``amp.init``, every ``convert_*``, ``cast_model`` and a tuned policy get their op lists here, so
an override means the same thing everywhere and is checked once: names must be registered
operators (:func:`mxamp.backend.registry.check_op_names`), and naming any alias of an op moves
the op with all its aliases.

>>> lists_for('float16', fp32_ops=['flatten']).category('Flatten')
'fp32'
"""
from mxamp.backend.registry import check_op_names, registered_ops
from mxamp.errors import check_condition_list, check_name_list
from mxamp.lists import check_disjoint, get_op_lists, reference_view, symbol_bf16, symbol_fp16


def lists_for(target, target_precision_ops=None, fp32_ops=None, conditional_fp32_ops=None,
              low_precision_argument="target_precision_ops", policy=None):
    """The op lists of ``target`` with a caller's overrides, checked and alias-aware.

    The one resolver behind ``amp.init``, every ``convert_*`` and ``cast_model``. The defaults
    are mxamp's op lists with any edits made to the reference's module lists
    (``amp.lists.symbol_fp16`` / ``symbol_bf16``); the three override lists replace the defaults
    of their category (as in the reference); naming any
    alias of an op moves the op and all its aliases; an unknown name, an op in two lists or a
    malformed entry is an :class:`~mxamp.errors.AmpArgumentError` naming the argument (the
    low-precision list as ``low_precision_argument``: ``convert_*`` call it
    ``target_dtype_ops``). A tuned ``policy`` (:class:`~mxamp.precision.policy.Policy`) adds
    its float32 ops and conditional rules on top of the caller's lists. Each check runs once,
    here: entry points pass their arguments through unchecked.

    >>> lists_for('float16', fp32_ops=['flatten']).category('Flatten')
    'fp32'
    """
    lists = _with_reference_edits(get_op_lists(target))
    given = {low_precision_argument: check_name_list(target_precision_ops,
                                                     low_precision_argument),
             "fp32_ops": check_name_list(fp32_ops, "fp32_ops")}
    conditional = check_condition_list(conditional_fp32_ops)
    if policy is not None:
        given["fp32_ops"], conditional = policy.overrides(given["fp32_ops"], conditional)
    if all(v is None for v in given.values()) and conditional is None:
        return lists
    for what, names in given.items():
        if names is not None:
            check_op_names(names, what)
    if conditional is not None:
        check_op_names([entry[0] for entry in conditional], "conditional_fp32_ops")
    # named as the caller named them (convert_*: target_dtype_ops), before with_overrides does
    named = {what: names for what, names in given.items() if names is not None}
    if conditional is not None:
        named["conditional_fp32_ops"] = [entry[0] for entry in conditional]
    check_disjoint(named, registered_ops().canonical)
    return lists.with_overrides(target_precision_ops=given[low_precision_argument],
                                fp32_ops=given["fp32_ops"], conditional_fp32_ops=conditional,
                                canonical=registered_ops().canonical)


_REFERENCE_MODULES = {"float16": symbol_fp16, "bfloat16": symbol_bf16}


def _with_reference_edits(lists):
    module = _REFERENCE_MODULES[lists.target]
    return reference_view.apply_edits(lists, module, module.ORIGINALS,
                                      canonical=_canonical_if_edited(module))


def _canonical_if_edited(module):
    """The alias map, built only when some list of ``module`` was edited (it costs ~10 ms)."""
    edited = any(getattr(module, name) != module.ORIGINALS[name]
                 for name in module.ORIGINALS)
    return registered_ops().canonical if edited else None
