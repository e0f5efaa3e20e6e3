"""The package's layers: every import of mxamp points down the ranks.

The table below is the architecture (``docs/architecture.md`` draws the same tree): each unit
of the package has a rank, and a module may import from a unit of a lower rank or from its own
unit (where imports stay acyclic), never from a unit of the same or a higher rank. The test
parses every import of every module, function-level imports included, so a late
``from mxamp.x import y`` inside a function is held to the same rule.

It replaces the file-name allow-list that ``tests/test_plan.py`` kept (``MAY_CALL``): that the
precision of an op is decided in ``mxamp.precision`` only is now the rank rule plus
:func:`test_only_the_precision_unit_resolves_lists_and_device_plans`.
"""
import ast
import os

import pytest

import mxamp

PACKAGE_DIR = os.path.dirname(mxamp.__file__)

#: unit -> rank. A module's unit is the longest entry its dotted name starts with.
RANKS = {
    "mxamp._version": 0, "mxamp.errors": 0,
    "mxamp.dtypes": 1,
    "mxamp.backend": 2, "mxamp.lists": 2,
    "mxamp.runtime": 3,
    "mxamp.precision": 4,
    "mxamp.patching": 5, "mxamp.conversion": 5, "mxamp.training": 5,
    "mxamp.tuning": 6, "mxamp.compare": 6, "mxamp.doctor": 6, "mxamp.launch": 6,
    "mxamp.lists.__main__": 6,           # the op lists' command line: a command on top of data
    "mxamp.amp": 7,
    "mxamp.standin": 8,                  # mxnet.contrib.amp made to mean the facade
    "mxamp": 9,                          # the package's __init__: re-exports the facade
    "mxamp.__main__": 9,                 # python -m mxamp run: install, then the script
}

#: The functions that turn a request into op lists and device plans: only the precision unit
#: (and the facade, for the reference's ``amp.list_*`` names) may call them.
DECIDING = {"device_plan", "lists_for"}


def modules():
    """``{dotted module name: path}`` of every module of the package."""
    found = {}
    root = os.path.dirname(PACKAGE_DIR)
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


def unit_of(module):
    """The unit of ``module``: the longest key of :data:`RANKS` it is, or lies under."""
    best = None
    for unit in RANKS:
        if module == unit or module.startswith(unit + "."):
            if best is None or len(unit) > len(best):
                best = unit
    return best


def imports(module, path, known):
    """``[(imported mxamp module, line)]`` for every import in ``path``, anywhere in it."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("mxamp")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] +
                                ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("mxamp"):
                continue
            names = [base + "." + a.name for a in node.names if base + "." + a.name in known]
            # `from mxamp.x import y` imports module y where y is one, else names of mxamp.x
            out += [(n, node.lineno) for n in names] or [(base, node.lineno)]
    return out


def violations(known=None):
    """Messages for every import in ``known`` (default: the package's modules) that climbs."""
    known = modules() if known is None else known
    found = []
    for module, path in sorted(known.items()):
        unit = unit_of(module)
        for target, line in imports(module, path, known):
            target_unit = unit_of(target)
            if target_unit == unit or target == module:
                continue
            if RANKS[target_unit] >= RANKS[unit]:
                found.append("%s:%d imports %s: %s (rank %d) may import only lower ranks, and "
                             "%s has rank %d" % (os.path.relpath(path, os.path.dirname(PACKAGE_DIR)),
                                                 line, target, unit, RANKS[unit], target_unit,
                                                 RANKS[target_unit]))
    return found


def test_every_module_has_a_rank():
    missing = [m for m in modules() if unit_of(m) is None]
    assert not missing, "add these modules' units to RANKS (and to docs/architecture.md): %s" \
        % missing
    # the walk reached the package's top and its subpackages, as their dotted names
    landmarks = {"mxamp", "mxamp.amp", "mxamp.backend.cpu", "mxamp.training.scaler"}
    assert landmarks <= set(modules()), "the walk found the package: %s" % sorted(modules())


def test_every_import_points_down_the_ranks():
    found = violations()
    assert not found, "imports that climb:\n" + "\n".join(found)


def test_the_rank_check_catches_a_climbing_import(tmp_path):
    """The rule fails where it should: a runtime module importing the patcher climbs."""
    module, path = "mxamp.runtime.example", tmp_path / "example.py"
    path.write_text("def f():\n    from mxamp.patching import patcher\n")
    known = dict(modules(), **{module: str(path)})
    (target, line), = imports(module, str(path), known)
    assert (target, line) == ("mxamp.patching.patcher", 2)
    # the checker itself, run over the package plus the planted module, reports that import
    found = violations(known)
    assert [m for m in found if "example.py" in m] == [
        "%s:2 imports mxamp.patching.patcher: mxamp.runtime (rank 3) may import only lower "
        "ranks, and mxamp.patching has rank 5" % os.path.relpath(str(path), os.path.dirname(
            PACKAGE_DIR))], found


@pytest.mark.parametrize("unit", sorted({unit_of(m) for m in modules()}))
def test_imports_within_a_unit_are_acyclic(unit):
    known = modules()
    graph = {m: {t for t, _ in imports(m, p, known) if unit_of(t) == unit and t != m
                 and not (t == unit and m.startswith(unit + "."))}   # a package's own __init__
             for m, p in known.items() if unit_of(m) == unit}
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != "open", "cycle in %s: %s" % (
                unit, " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_only_the_precision_unit_resolves_lists_and_device_plans():
    offenders = []
    for module, path in sorted(modules().items()):
        if unit_of(module) in ("mxamp.precision", "mxamp.amp"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            name = (node.attr if isinstance(node, ast.Attribute)
                    else node.id if isinstance(node, ast.Name) else None)
            if name in DECIDING:
                offenders.append("%s:%d %s" % (module, node.lineno, name))
    assert not offenders, ("entry points read mxamp.precision.plan.make's Plan instead of "
                           "resolving lists or device plans themselves: %s" % offenders)
