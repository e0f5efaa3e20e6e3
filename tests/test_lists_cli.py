"""``python -m mxamp.lists`` and the layout behind it: common.py plus each target's differences.

The command line runs against the real libmxnet registry (aliases resolve through it); the
layout tests rebuild each target's lists from ``mxamp.lists.common`` and the target's ``DIFF_*``
tables without :func:`~mxamp.lists.common.compose`, so a bug there cannot hide itself.
"""
import ast
import doctest
import os
import re
import subprocess
import sys

import pytest

import mxamp.lists.__main__ as cli
from mxamp.backend.cpu import BF16_CLASSES
from mxamp.lists import bfloat16, common, float16, get_op_lists
from mxamp.backend.registry import registered_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("float16", "bfloat16")
DATA = {"float16": float16, "bfloat16": bfloat16}
TABLES = common.CATEGORY_TABLES
CATEGORY_OF_TABLE = dict(zip(TABLES, ("low_precision", "fp32", "widest", "neutral",
                                      "conditional_fp32")))


def run_main(capsys, *argv):
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def explained(capsys, op):
    """``--explain op`` parsed: (header lines, {target: {field: value}})."""
    status, out, err = run_main(capsys, "--explain", op)
    assert status == 0 and not err, (status, err)
    header, sections, current = [], {}, None
    for line in out.splitlines():
        if line.rstrip(":") in TARGETS and not line.startswith(" "):
            current = sections.setdefault(line.rstrip(":"), {})
        elif current is None:
            header.append(line)
        else:
            field, _, value = line.strip().partition(":")
            current[field] = value.strip()
    assert set(sections) == set(TARGETS), out
    return header, sections


# ------------------------------------------------------------------ --explain
def test_explain_convolution(capsys):
    header, info = explained(capsys, "Convolution")
    assert header[0] == "Convolution"
    assert header[1] == "aliases: Convolution, _npx_convolution"
    for target in TARGETS:
        assert info[target]["category"] == "low_precision"
        assert info[target]["stated in"] == "common.py (both targets)"
        assert info[target]["fp32 params"] == "-"
    assert info["float16"]["CPU kernel"].startswith("missing (NO_CPU_KERNEL")
    bf16 = info["bfloat16"]
    assert bf16["cpu class none"].startswith("no kernel, computed in float32 (oneDNN op")
    for cpu_class in ("emulated", "native"):
        assert bf16["cpu class %s" % cpu_class].startswith(
            "kernel present; float32 where depthwise=True and in_channels not a multiple of 16")
    amx = bf16["cpu class amx"]
    assert amx.startswith("kernel present; float32 where kernel=1 and stride=1"), amx
    assert "in_channels a multiple of 16" in amx and "spatial_size in 27..48" in amx, amx
    assert "corrupt the heap" in amx, "the AMX guard says why: %s" % amx
    assert set(k for k in bf16 if k.startswith("cpu class")) == {
        "cpu class %s" % c for c in BF16_CLASSES}


def test_explain_alias_is_explained_as_its_canonical_op(capsys):
    alias_header, alias_info = explained(capsys, "flatten")
    canon_header, canon_info = explained(capsys, "Flatten")
    assert alias_header[0] == "Flatten (asked for flatten, an alias of Flatten)"
    assert canon_header[0] == "Flatten"
    assert alias_header[1:] == canon_header[1:] == [
        "aliases: %s" % ", ".join(sorted(registered_ops().aliases["Flatten"]))]
    assert "flatten" in alias_header[1] and "_npx_batch_flatten" in alias_header[1]
    assert alias_info == canon_info
    assert alias_info["float16"]["category"] == "neutral"

    header, info = explained(capsys, "_npx_fully_connected")
    assert header[0].startswith("FullyConnected (asked for _npx_fully_connected")
    assert info["bfloat16"]["category"] == "low_precision"


@pytest.mark.parametrize("op, fp16, bf16", [
    ("Dropout", ("neutral", "-"), ("fp32", bfloat16.R_NO_BF16)),
    ("square", ("fp32", "overflows fp16 above 256"), ("fp32", bfloat16.SLOW_BF16["square"])),
])
def test_explain_op_that_differs_between_targets(capsys, op, fp16, bf16):
    _, info = explained(capsys, op)
    for target, (category, reason) in (("float16", fp16), ("bfloat16", bf16)):
        assert (info[target]["category"], info[target]["reason"]) == (category, reason), target
        assert info[target]["stated in"] == "%s.py (differs from common.py)" % target
        lists = get_op_lists(target)
        assert lists.category(op) == category and (lists.reason(op) or "-") == reason


def test_explain_conditional_op_and_fp32_params(capsys):
    _, info = explained(capsys, "Activation")
    assert info["float16"]["category"] == "conditional_fp32 (float32 when act_type is softrelu)"
    assert info["bfloat16"]["category"] == "conditional_fp32 (float32 when act_type is softsign)"
    assert info["bfloat16"]["cpu class none"].startswith("no kernel")
    _, info = explained(capsys, "BatchNorm")
    assert info["float16"]["fp32 params"] == "gamma, beta, moving_mean, moving_var"
    _, info = explained(capsys, "SoftmaxOutput")
    assert info["bfloat16"]["loss output"] == "yes"


def test_unknown_op_exits_2_naming_it(capsys):
    status, out, err = run_main(capsys, "--explain", "Convolutoin")
    assert status == 2 and not out
    assert "'Convolutoin'" in err and "Convolution" in err  # names it, suggests a close name


def test_module_entry_point_in_a_subprocess():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "mxamp.lists", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    bad = run("--explain", "no_such_operator_xyz")
    assert bad.returncode == 2, bad
    assert "no_such_operator_xyz" in bad.stderr and not bad.stdout
    good = run("--explain", "flatten")
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("Flatten (asked for flatten")


# ------------------------------------------------------------------ --diff and the summary
def differing_canonical_ops():
    """Canonical ops whose category or condition differs, from get_op_lists alone."""
    lists = {t: get_op_lists(t) for t in TARGETS}
    canonical = registered_ops().canonical
    names = set().union(*(lists[t].all_ops() for t in TARGETS))
    return {canonical.get(op, op) for op in names
            if len({(lists[t].category(op), lists[t].conditional_fp32.get(op))
                    for t in TARGETS}) > 1}


def test_diff_lists_every_differing_op_once(capsys):
    status, out, err = run_main(capsys, "--diff")
    assert status == 0 and not err
    lines = out.splitlines()
    expected = differing_canonical_ops()
    assert {"Dropout", "relu", "Activation", "dot"} <= expected
    count = re.match(r"(\d+) ops classified differently", lines[-1])
    assert count and int(count.group(1)) == len(expected), lines[-1]
    op_lines = [line for line in lines if line.startswith("  ")]
    listed = [line.split()[0] for line in op_lines]
    assert sorted(listed) == sorted(expected)  # one line per canonical op, no more
    dropout = next(line for line in op_lines if line.split()[0] == "Dropout")
    assert "float16: neutral" in dropout and "bfloat16: fp32: " + bfloat16.R_NO_BF16 in dropout
    relu = next(line for line in op_lines if line.split()[0] == "relu")
    assert "float16: neutral" in relu and "bfloat16: fp32: " + bfloat16.SLOW_BF16["relu"] in relu


def test_summary_counts(capsys):
    status, out, err = run_main(capsys)
    assert status == 0 and not err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    for i, target in enumerate(TARGETS):
        lists = get_op_lists(target)
        for category in CATEGORY_OF_TABLE.values():
            assert int(rows[category][i]) == len(getattr(lists, category)), (target, category)
    shared = literal_entries(common.__file__, TABLES)
    assert "common.py holds %d entries" % shared in out, (shared, out)


def literal_entries(path, tables):
    """How many distinct keys the dict literals assigned to ``tables`` in ``path`` spell out:
    counted from the source text, not from the imported dicts :func:`cli.summary` measures."""
    found = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in tables:
                    found[target.id] = {ast.literal_eval(k) for k in node.value.keys}
    assert set(found) == set(tables), "common.py assigns each table one dict literal"
    return sum(len(keys) for keys in found.values())


def test_cli_docstring_examples():
    # pytest's --doctest-modules skips __main__.py files, so run its examples here.
    result = doctest.testmod(cli, optionflags=doctest.ELLIPSIS)
    # 7: the examples __main__.py's docstrings hold in this source (module 1, explain 1,
    # differences 2, diff 1, summary 1, main 1); one lost to a docstring edit shows here.
    assert result.attempted == 7 and result.failed == 0, result


# ------------------------------------------------------------------ the layout: each fact once
@pytest.mark.parametrize("target", TARGETS)
def test_common_plus_differences_reproduce_the_lists(target):
    module = DATA[target]
    diffs = {t: getattr(module, "DIFF_" + t) for t in TABLES}
    overridden = set().union(*diffs.values())
    # Built by hand, not with common.compose: common's entries, then the target's own.
    expected = {t: {op: v for op, v in getattr(common, t).items() if op not in overridden}
                for t in TABLES}
    for t in TABLES:
        expected[t].update(diffs[t])
    for t in TABLES:
        assert getattr(module, t) == expected[t], "%s.%s is not common + DIFF_%s" % (
            target, t, t)
    # Every common entry reaches the target unchanged unless the target overrides it.
    for t in TABLES:
        for op, entry in getattr(common, t).items():
            if op not in overridden:
                assert common.lookup(op, module) == (t, entry), (target, op)
    assert module.LOSS_OUTPUT == common.LOSS_OUTPUT
    assert module.FP32_PARAMS == common.FP32_PARAMS
    lists = get_op_lists(target)
    for t, category in CATEGORY_OF_TABLE.items():
        if t == "CONDITIONAL_FP32":
            assert lists.conditional_fp32 == {
                op: (param, tuple(values)) for op, (param, values, _) in expected[t].items()}
        else:
            assert getattr(lists, category) == frozenset(expected[t]), (target, category)
    reasons = {op: v for t in TABLES[:-1] for op, v in expected[t].items() if v}
    reasons.update({op: v[2] for op, v in expected["CONDITIONAL_FP32"].items() if v[2]})
    assert lists.reasons == reasons
    assert lists.loss_output == frozenset(common.LOSS_OUTPUT)
    assert lists.no_cpu_kernel == frozenset(module.NO_CPU_KERNEL)


@pytest.mark.parametrize("target", TARGETS)
def test_differences_really_differ(target):
    module = DATA[target]
    for t in TABLES:
        for op, entry in getattr(module, "DIFF_" + t).items():
            assert common.lookup(op, common) != (t, entry), (
                "%s.DIFF_%s[%r] repeats common.py's entry" % (target, t, op))


def test_no_fact_is_stated_by_both_targets():
    # An entry both targets state alike belongs in common.py, once.
    for t in TABLES:
        fp16, bf16 = getattr(float16, "DIFF_" + t), getattr(bfloat16, "DIFF_" + t)
        same = sorted(op for op in set(fp16) & set(bf16) if fp16[op] == bf16[op])
        assert not same, "both targets state DIFF_%s entries %s: move them to common.py" % (
            t, same)
    assert float16.NO_CPU_KERNEL != bfloat16.NO_CPU_KERNEL
    assert float16.NO_KERNEL_BY_CPU_CLASS != bfloat16.NO_KERNEL_BY_CPU_CLASS


def reason_constants(module):
    """{name: value} of the R_* constants a module's own source assigns (imports excluded)."""
    tree = ast.parse(open(module.__file__).read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith("R_"):
                    out[target.id] = getattr(module, target.id)
    return out


def test_no_reason_constant_is_defined_twice():
    defined = {m.__name__: reason_constants(m) for m in (common, float16, bfloat16)}
    assert defined["mxamp.lists.common"], "common.py must define the shared reasons"
    seen_names, seen_values = {}, {}
    for module, constants in defined.items():
        for name, value in constants.items():
            assert name not in seen_names, "%s is defined in %s and %s" % (
                name, seen_names[name], module)
            assert value not in seen_values, "%s.%s repeats the text of %s" % (
                module, name, seen_values[value])
            seen_names[name], seen_values[value] = module, "%s.%s" % (module, name)
    # The target modules still export the shared reasons their full tables hold.
    for module in (float16, bfloat16):
        for name, value in defined["mxamp.lists.common"].items():
            assert getattr(module, name) == value, (module.__name__, name)


def test_explain_transpose_says_no_class_runs_it_in_bfloat16(capsys):
    """transpose's bfloat16 kernel corrupts the heap on every class (measured on the Zen 4 under
    each cap: tests/test_every_cpu_fp32.py checks it), so no class may say "kernel present"."""
    _, info = explained(capsys, "transpose")
    bf16 = info["bfloat16"]
    assert bf16["category"] == "fp32" and "corrupts the heap" in bf16["reason"], bf16
    for cpu_class in BF16_CLASSES:
        assert bf16["cpu class %s" % cpu_class] == \
            "no working kernel on any class, float32 whatever the lists say", cpu_class
