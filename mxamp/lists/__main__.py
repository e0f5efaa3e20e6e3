"""Command line for the op lists: explain one operator, or what float16 and bfloat16 disagree on.

::

    python -m mxamp.lists                      # category counts, shared vs differing entries
    python -m mxamp.lists --explain flatten    # one operator (any alias), for both targets
    python -m mxamp.lists --diff               # every operator the targets classify differently

``--explain`` and ``--diff`` resolve aliases with the loaded libmxnet's registry
(:func:`mxamp.backend.registry.registered_ops`), so ``flatten`` is explained as ``Flatten``; the summary
reads only the data modules. An unknown operator name exits with status 2.

>>> main(['--explain', '_npx_dropout'])  # doctest: +ELLIPSIS
Dropout (asked for _npx_dropout, an alias of Dropout)
aliases: Dropout, _npx_dropout
float16:
  category:    neutral
  ...
bfloat16:
  category:    fp32
  reason:      no bfloat16 CPU kernel in MXNet 1.9.1 (probe: Unknown type enum 12)
  stated in:   bfloat16.py (differs from common.py)
  ...
0
"""
import argparse
import difflib
import sys

from mxamp.backend.cpu import BF16_CLASSES
from mxamp.dtypes import TARGETS
from mxamp.lists import bfloat16, common, float16
from mxamp.lists.conditions import Condition

#: Each target's data module (its full tables, and the DIFF_ tables it states itself).
MODULES = {"float16": float16, "bfloat16": bfloat16}
#: OpLists category name of each data table.
CATEGORY_OF_TABLE = dict(zip(common.CATEGORY_TABLES, (
    "low_precision", "fp32", "widest", "neutral", "conditional_fp32")))


def _classification(op, module):
    """(category, condition or None, reason) of ``op`` in ``module``'s full tables, or None."""
    found = common.lookup(op, module)
    if found is None:
        return None
    table, entry = found
    if table == "CONDITIONAL_FP32":
        param, values, reason = entry
        return CATEGORY_OF_TABLE[table], (param, tuple(values)), reason
    return CATEGORY_OF_TABLE[table], None, entry


def _describe(classification):
    """One-line form: ``fp32: reason``, ``conditional_fp32 (act_type in elu, selu): reason``."""
    category, condition, reason = classification
    text = category
    if condition is not None:
        text += " (%s in %s)" % (condition[0], ", ".join(condition[1]))
    return "%s: %s" % (text, reason) if reason else text


def _first(table, names):
    """The entry of the first of ``names`` that ``table`` holds, or None."""
    for name in names:
        if name in table:
            return table[name]
    return None


def _registry():
    # Imported late: only --explain and --diff need the registry; the summary reads data only.
    from mxamp.backend.registry import registered_ops
    return registered_ops()


def explain(name, out=None, err=None):
    """Print how each target classifies operator ``name`` and why; return the exit status.

    An alias is explained as its canonical operator. Status 2 (message on ``err``) for a name
    that no operator is registered under and no list holds.

    >>> explain('Convolution')  # doctest: +ELLIPSIS
    Convolution
    aliases: Convolution, _npx_convolution
    float16:
      category:    low_precision
      reason:      -
      stated in:   common.py (both targets)
      fp32 params: -
      loss output: no
      CPU kernel:  missing (NO_CPU_KERNEL: computed in float32 on a CPU context)
    bfloat16:
    ...
      cpu class none:     no kernel, computed in float32 (oneDNN op: no bfloat16 kernel ...)
      cpu class emulated: kernel present; float32 where depthwise=True and in_channels not a ...
      cpu class native:   kernel present; float32 where depthwise=True and in_channels not a ...
      cpu class amx:      kernel present; float32 where kernel=1 and stride=1 and ...
    0
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    registry = _registry()
    listed = _listed_names()
    if name not in registry.names and name not in listed:
        _say_unknown(name, registry.names | listed, err)
        return 2
    canon = registry.canonical.get(name, name)
    aliases = sorted(registry.aliases.get(canon, {name}))
    names = [canon] + [a for a in aliases if a != canon]  # the canonical name's entries first
    print(canon if name == canon else "%s (asked for %s, an alias of %s)" % (canon, name, canon),
          file=out)
    print("aliases: %s" % ", ".join(aliases), file=out)
    op = next((n for n in names if n in listed), canon)  # the lists may hold it by an alias
    for target, module in MODULES.items():
        print("%s:" % target, file=out)
        _explain_target(op, names, target, module, out)
    return 0


def _listed_names():
    """Every operator name some table of some target holds."""
    listed = set()
    for module in MODULES.values():
        for table in common.CATEGORY_TABLES:
            listed |= set(getattr(module, table))
    return listed


def _say_unknown(name, known, err):
    """Tell ``err`` that ``name`` is no operator, with the closest of the ``known`` names."""
    close = difflib.get_close_matches(name, sorted(known), n=5)
    hint = " (did you mean %s?)" % ", ".join(close) if close else ""
    print("unknown operator %r: no MXNet operator is registered under that name and no op "
          "list holds it%s" % (name, hint), file=err)


def _explain_target(op, names, target, module, out):
    """Print how ``module``, the data of ``target``, classifies ``op`` (all names: ``names``)."""
    found = _classification(op, module)
    if found is None:
        why = ("a backward helper: it follows its forward op" if "backward" in op.split("_")
               else "in no list of %s" % target)
        print("  category:    unclassified (%s)" % why, file=out)
        return
    category, condition, reason = found
    if condition is not None:
        category += " (float32 when %s is %s)" % (condition[0], " or ".join(condition[1]))
    if common.lookup(op, module, "DIFF_") is not None:
        source = "%s.py (differs from common.py)" % target
    else:
        source = "common.py (both targets)"
    params = _first(module.FP32_PARAMS, names)
    print("  category:    %s" % category, file=out)
    print("  reason:      %s" % (reason or "-"), file=out)
    print("  stated in:   %s" % source, file=out)
    print("  fp32 params: %s" % (", ".join(params) if params else "-"), file=out)
    print("  loss output: %s" % ("yes" if _first(module.LOSS_OUTPUT, names) is not None
                                 else "no"), file=out)
    if module.NO_CPU_KERNEL:  # a target without CPU gaps has an empty table: say nothing
        _print_cpu_kernel(module, names, out)
    if module.NO_KERNEL_BY_CPU_CLASS:
        _print_cpu_classes(module, names, out)


def _print_cpu_kernel(module, names, out):
    """Print whether the target has a CPU kernel for the op (``NO_CPU_KERNEL``)."""
    missing = _first(module.NO_CPU_KERNEL, names)
    print("  CPU kernel:  %s" % (
        "present (not in NO_CPU_KERNEL)" if missing is None else "missing (NO_CPU_KERNEL:"
        " computed in float32 on a CPU context%s)" % ("; " + missing if missing else "")),
        file=out)


def _print_cpu_classes(module, names, out):
    """Print, per CPU class, whether the op has a kernel and where its shape rules hold."""
    width = max(len(c) for c in BF16_CLASSES)
    everywhere = _first(getattr(module, "FP32_ON_EVERY_CPU", {}), names)
    for cpu_class in BF16_CLASSES:
        missing = _first(module.NO_KERNEL_BY_CPU_CLASS.get(cpu_class, {}), names)
        state = "kernel present" if missing is None else (
            "no kernel, computed in float32" + (" (%s)" % missing if missing else ""))
        if everywhere is not None:   # FP32_ON_EVERY_CPU: whatever category an override gives it
            state = "no working kernel on any class, float32 whatever the lists say"
        rules = _first(getattr(module, "FP32_WHEN_BY_CPU_CLASS", {}).get(cpu_class, {}), names)
        for tests, if_unknown, why in rules or ():
            state += "; float32 where %s: %s" % (Condition(tests, if_unknown).describe(), why)
        print("  cpu class %s %s" % ((cpu_class + ":").ljust(width + 1), state), file=out)


def differences():
    """Canonical op -> (all its names, {target: (category, condition, reason)}) for the ops
    whose category or condition differs between the targets (a reason alone does not count).

    >>> names, found = differences()['Dropout']
    >>> names, found['float16'][0], found['bfloat16'][0]
    (['Dropout', '_npx_dropout'], 'neutral', 'fp32')
    """
    registry = _registry()
    modules = MODULES
    groups = {}
    for table in common.CATEGORY_TABLES:
        for module in modules.values():
            for op in getattr(module, table):
                groups.setdefault(registry.canonical.get(op, op), set()).add(op)
    result = {}
    for canon, names in groups.items():
        op = canon if canon in names else min(names)
        found = {t: _classification(op, m) for t, m in modules.items()}
        if len({f[:2] if f else None for f in found.values()}) > 1:
            result[canon] = (sorted(names), found)
    return result


def diff(out=None):
    """Print every op the targets classify differently, grouped by category; return 0.

    >>> diff()  # doctest: +ELLIPSIS
    float16 low_precision, bfloat16 fp32 (12 ops):
    ...
    float16 fp32, bfloat16 neutral (1 op):
      _contrib_BatchNormWithReLU  float16: fp32: ...  |  bfloat16: neutral: oneDNN kernel takes ...
    ...
      relu (+_sparse_relu)  float16: neutral  |  bfloat16: fp32: MXNet's generic ...
    ...
    201 ops classified differently by float16 and bfloat16 (300 names with their aliases)
    0
    """
    out = sys.stdout if out is None else out
    order = {c: i for i, c in enumerate(CATEGORY_OF_TABLE.values())}
    groups = {}
    for canon, (names, found) in differences().items():
        key = tuple(found[t][0] if found[t] else "unclassified" for t in TARGETS)
        groups.setdefault(key, []).append((canon, names, found))
    total_names = 0
    for key in sorted(groups, key=lambda k: tuple(order.get(c, len(order)) for c in k)):
        ops = sorted(groups[key], key=lambda g: g[0].lower())
        heading = ", ".join("%s %s" % (t, c) for t, c in zip(TARGETS, key))
        if len(set(key)) == 1:  # same category: the conditions differ
            heading += " on different conditions"
        print("%s (%d op%s):" % (heading, len(ops), "" if len(ops) == 1 else "s"), file=out)
        for canon, names, found in ops:
            others = [n for n in names if n != canon]
            label = canon + (" (+%s)" % ", ".join(others) if others else "")
            print("  %s  %s" % (label, "  |  ".join(
                "%s: %s" % (t, _describe(found[t]) if found[t] else "unclassified")
                for t in TARGETS)), file=out)
            total_names += len(names)
        print("", file=out)
    count = sum(len(v) for v in groups.values())
    print("%d ops classified differently by float16 and bfloat16 (%d names with their aliases)"
          % (count, total_names), file=out)
    return 0


def summary(out=None):
    """Print category counts per target and how many entries are shared or differ; return 0.

    >>> summary()  # doctest: +ELLIPSIS
    category          float16  bfloat16
    low_precision          22         7
    ...
    """
    out = sys.stdout if out is None else out
    modules = MODULES
    print("%-16s %s" % ("category", "  ".join("%8s" % t for t in TARGETS)), file=out)
    for table, category in CATEGORY_OF_TABLE.items():
        print("%-16s %s" % (category, "  ".join(
            "%8d" % len(getattr(modules[t], table)) for t in TARGETS)), file=out)
    print("%-16s %s" % ("total names", "  ".join("%8d" % sum(
        len(getattr(modules[t], table)) for table in common.CATEGORY_TABLES) for t in TARGETS)),
        file=out)
    shared = sum(len(getattr(common, table)) for table in common.CATEGORY_TABLES)
    own = {t: sum(len(getattr(m, "DIFF_" + table)) for table in common.CATEGORY_TABLES)
           for t, m in modules.items()}
    print("\ncommon.py holds %d entries both targets share; %s" % (shared, ", ".join(
        "%s.py states %d of its own" % (t, n) for t, n in own.items())), file=out)
    print("(python -m mxamp.lists --diff lists the differences; --explain OP explains one op)",
          file=out)
    return 0


def main(argv=None):
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    >>> main(['--explain', 'no_such_op'])
    2
    """
    parser = argparse.ArgumentParser(
        prog="python -m mxamp.lists",
        description="Explain mxamp's op lists: how float16 and bfloat16 classify operators.")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--explain", metavar="OP",
                        help="how each target classifies OP (any alias) and why")
    action.add_argument("--diff", action="store_true",
                        help="every op the two targets classify differently")
    args = parser.parse_args(argv)
    if args.explain is not None:
        return explain(args.explain)
    if args.diff:
        return diff()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
