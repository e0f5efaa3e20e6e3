"""The reference's module-level op lists, generated from mxamp's data, and what edits to them mean.

Code written for ``mxnet.contrib.amp`` reads and extends ``amp.lists.symbol_fp16`` and
``amp.lists.symbol_bf16``: ``FP16_FUNCS``/``BF16_FUNCS`` (low precision), ``FP16_FP32_FUNCS``/
``BF16_FP32_FUNCS`` (dtype-neutral), ``FP32_FUNCS``, ``WIDEST_TYPE_CASTS``,
``CONDITIONAL_FP32_FUNCS`` (``(op, parameter, [values])``), ``LOSS_OUTPUT_FUNCTIONS`` and
``BF16_USE_FP32_PARAMS``. mxamp's :mod:`~mxamp.lists.symbol_fp16` and
:mod:`~mxamp.lists.symbol_bf16` hold the same names, made from mxamp's op lists at import.

They are live, as in the reference: ``amp.init`` and every ``convert_*`` read them when they
resolve their default lists (:func:`apply_edits`, called by :func:`mxamp.precision.resolve.lists_for`). A
name appended to a list moves that operator (with all its aliases) to the list's category,
even if the list of its old category still names it (the edit wins); a name removed from a
list makes the operator dtype-neutral. Unedited lists change nothing.

>>> from mxamp.lists import symbol_fp16
>>> 'FullyConnected' in symbol_fp16.FP16_FUNCS and 'softmax' in symbol_fp16.FP32_FUNCS
True
"""
from dataclasses import replace

from mxamp.lists import get_op_lists, names_by_operator

#: Per target: (reference list name, OpLists field) in the reference's order.
LIST_NAMES = {
    "float16": (("FP16_FUNCS", "low_precision"), ("FP16_FP32_FUNCS", "neutral"),
                ("FP32_FUNCS", "fp32"), ("CONDITIONAL_FP32_FUNCS", "conditional_fp32"),
                ("WIDEST_TYPE_CASTS", "widest"), ("LOSS_OUTPUT_FUNCTIONS", "loss_output")),
    "bfloat16": (("BF16_FUNCS", "low_precision"), ("BF16_FP32_FUNCS", "neutral"),
                 ("FP32_FUNCS", "fp32"), ("CONDITIONAL_FP32_FUNCS", "conditional_fp32"),
                 ("WIDEST_TYPE_CASTS", "widest"), ("LOSS_OUTPUT_FUNCTIONS", "loss_output"),
                 ("BF16_USE_FP32_PARAMS", "fp32_params")),
}
#: The categories an op can be moved into by appending it to a list.
_CATEGORIES = ("low_precision", "neutral", "fp32", "conditional_fp32", "widest")


def reference_lists(target):
    """The reference's lists for ``target`` (name -> list or dict), made from mxamp's data.

    >>> reference_lists('bfloat16')['BF16_USE_FP32_PARAMS']['BatchNorm'][:2]
    ['', 'gamma']
    """
    lists = get_op_lists(target)
    out = {}
    for name, field in LIST_NAMES[target]:
        value = getattr(lists, field)
        if field == "conditional_fp32":
            out[name] = [(op, param, list(values)) for op, (param, values) in
                         sorted(value.items())]
        elif field == "fp32_params":   # the reference's shape: '' for the data input first
            out[name] = {op: [""] + list(names) for op, names in sorted(value.items())}
        else:
            out[name] = sorted(value)
    return out


def _entries(value, field):
    """A list's entries as a hashable, comparable form."""
    if field == "conditional_fp32":
        return {(e[0], e[1], tuple(str(v) for v in e[2])) for e in value}
    if field == "fp32_params":
        return {(op, tuple(n for n in names if n)) for op, names in value.items()}
    return set(value)


def apply_edits(lists, module, snapshot, canonical=None):
    """``lists`` with the edits made to ``module``'s lists since ``snapshot`` (their originals).

    ``canonical`` maps any operator name to its real name, so that an edit moves every alias
    of the operator it names.

    >>> from mxamp.lists import get_op_lists, symbol_fp16
    >>> apply_edits(get_op_lists('float16'), symbol_fp16, symbol_fp16.ORIGINALS) is \\
    ...     get_op_lists('float16')
    True
    """
    edits = {}
    for name, field in LIST_NAMES[lists.target]:
        now, before = getattr(module, name), snapshot[name]
        if now == before:
            continue
        now, before = _entries(now, field), _entries(before, field)
        edits[field] = (now - before, before - now)
    if not edits:
        return lists
    fields = {f: (set(getattr(lists, f)) if f != "conditional_fp32"
                  else dict(lists.conditional_fp32)) for f in _CATEGORIES}
    loss_output, fp32_params = set(lists.loss_output), dict(lists.fp32_params)
    same = names_by_operator(lists.all_ops(), canonical)
    for field, (added, removed) in edits.items():
        if field == "loss_output":
            loss_output = (loss_output | added) - removed
            continue
        if field == "fp32_params":
            fp32_params.update(dict(added))
            for op, _ in removed - added:
                if op not in dict(added):
                    fp32_params.pop(op, None)
            continue
        for entry in removed:
            op = entry[0] if field == "conditional_fp32" else entry
            for alias in same(op):
                fields[field].pop(alias, None) if field == "conditional_fp32" \
                    else fields[field].discard(alias)
                fields["neutral"].add(alias)
        for entry in added:
            op = entry[0] if field == "conditional_fp32" else entry
            for alias in same(op):
                for other in _CATEGORIES:
                    if other == "conditional_fp32":
                        fields[other].pop(alias, None)
                    else:
                        fields[other].discard(alias)
                if field == "conditional_fp32":
                    fields[field][alias] = (entry[1], entry[2])
                else:
                    fields[field].add(alias)
    return replace(lists, low_precision=frozenset(fields["low_precision"]),
                   neutral=frozenset(fields["neutral"]), fp32=frozenset(fields["fp32"]),
                   widest=frozenset(fields["widest"]),
                   conditional_fp32=fields["conditional_fp32"],
                   loss_output=frozenset(loss_output),
                   fp32_params={k: tuple(v) for k, v in fp32_params.items()})
