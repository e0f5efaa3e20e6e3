"""The package's shape: one-way imports, one boundary with MXNet's private API, one state.

* Every module imports on its own, and the import graph of ``mxamp`` (module-level *and*
  function-level imports) has no cycle.
* Every private MXNet name mxamp uses is listed in :mod:`mxamp.backend.mxnet_private` and exists in the
  installed MXNet (the contract: a build that lacks one fails here, naming it); no other module
  touches a private name of MXNet.
* ``amp.reset()`` clears every piece of process-wide state, and is safe under threads.
* Functions keep to 60 lines and modules to 400, unless a module's docstring says why not.
"""
import ast
import json
import os
import subprocess
import sys
import threading

import mxnet as mx
import numpy as np

import mxamp
from mxamp import amp
from mxamp.backend import mxnet_private
from mxamp.dtypes import BFLOAT16
from mxamp.runtime.state import STATE

PACKAGE_DIR = os.path.dirname(mxamp.__file__)


def module_files():
    """``{module name: path}`` of every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-3].replace(os.sep, ".")
                found[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return found


def imports_of(module, path):
    """mxamp modules ``module`` imports, anywhere in its code (function bodies included)."""
    tree = ast.parse(open(path).read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mxamp")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("mxamp"):
                continue
            out.add(base)
            for alias in node.names:      # `from . import state` imports a module
                if base + "." + alias.name in module_files():
                    out.add(base + "." + alias.name)
    return {m for m in out if m != module and m in module_files()}


def import_graph():
    return {m: imports_of(m, p) for m, p in module_files().items()}


def find_cycle(graph):
    """One cycle as a list of modules, or None (the package's own __init__ edges excluded:
    a submodule always imports through its package)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == "mxamp" or node == "mxamp" or (node.startswith(nxt + ".") and
                                                   nxt in ("mxamp.lists",)):
                continue
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


#: Where the size rules hold: the package, its tests, the examples, the benchmarks and CI's
#: scripts.
SIZED_FOLDERS = ("mxamp", "tests", "example", "benchmark", "ci")
MAX_FUNCTION_LINES, MAX_MODULE_LINES = 60, 400
SIZE_REASON = "Why over 400 lines"


def sized_files():
    """Every Python file under :data:`SIZED_FOLDERS` (the benchmark's archived results out)."""
    root = os.path.dirname(PACKAGE_DIR)
    for folder in SIZED_FOLDERS:
        for where, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = [d for d in dirs if d not in ("results", "__pycache__")]
            yield from (os.path.join(where, f) for f in sorted(files) if f.endswith(".py"))


def test_functions_and_modules_keep_to_their_sizes():
    """Counted from the source: a function from its ``def`` line to its last line, docstring
    included; a module by its lines, unless its docstring gives the reason
    (``mxamp/lists/common.py``: a data table, one entry per operator)."""
    too_long = []
    for path in sized_files():
        with open(path) as f:
            source = f.read()
        tree = ast.parse(source)
        rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES and SIZE_REASON not in (ast.get_docstring(tree) or ""):
            too_long.append("%s: %d lines" % (rel, lines))
        too_long += ["%s:%d %s(): %d lines" % (rel, node.lineno, node.name,
                                               node.end_lineno - node.lineno + 1)
                     for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not too_long, "over %d lines a function or %d a module: %s" % (
        MAX_FUNCTION_LINES, MAX_MODULE_LINES, "; ".join(too_long))


def test_import_graph_has_no_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: %s" % " -> ".join(cycle)
    # the cycle issue #11 found is gone: loss_outputs no longer reaches patching
    assert "mxamp.training.trainer" not in graph["mxamp.patching.loss_outputs"], graph["mxamp.patching.loss_outputs"]
    assert "mxamp.patching.patcher" not in graph["mxamp.training.trainer"], graph["mxamp.training.trainer"]


def test_leaf_modules_import_nothing_of_mxamp_but_their_data():
    graph = import_graph()
    assert graph["mxamp.training.scaler"] <= {"mxamp.errors"}, \
        "the loss scaler is a pure state machine: %s" % graph["mxamp.training.scaler"]
    assert graph["mxamp.errors"] == set() and graph["mxamp.backend.mxnet_private"] == set()
    assert graph["mxamp.backend.cpu"] <= {"mxamp.backend", "mxamp.backend.amx",
                                          "mxamp.backend.env"}, \
        "CPU detection needs nothing of mxamp but AMX's mechanics and the environment's reader"
    assert graph["mxamp.backend.amx"] <= {"mxamp.backend.timing"}, \
        "the AMX mechanics need nothing of mxamp but the timing loop"
    assert graph["mxamp.backend.env"] == set() and graph["mxamp.backend.timing"] == set()
    assert graph["mxamp.lists.conditions"] == set(), "conditions are data and pure functions"


IMPORT_EACH_ALONE = r"""
import importlib, json, sys, traceback
import mxnet
failures = {}
for module in sys.argv[1:]:
    for name in [k for k in sys.modules if k == "mxamp" or k.startswith("mxamp.")]:
        del sys.modules[name]
    try:
        importlib.import_module(module)
    except Exception:
        failures[module] = traceback.format_exc(limit=3)
print(json.dumps(failures))
"""


def test_every_module_imports_on_its_own():
    """Each module, imported first (all of mxamp forgotten), imports cleanly.

    Runs in a child interpreter: a second copy of mxamp in this process would re-register its
    custom operators and hooks with MXNet, pointing them at the copy's (empty) state.
    """
    modules = sorted(m for m in module_files() if m != "mxamp")
    assert len(modules) > 20, modules
    env = dict(os.environ, PYTHONPATH=os.path.dirname(PACKAGE_DIR))
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE] + modules, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert failures == {}, "modules that fail when imported first:\n%s" % "\n".join(
        "%s:\n%s" % item for item in failures.items())


# ------------------------------------------------------------ the boundary with MXNet
def _live_objects():
    """One live instance of each MXNet class whose private names mxamp uses."""
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize()
    trainer = mx.gluon.Trainer([p], "sgd", kvstore="local")
    with mx.autograd.record():
        loss = (p.data() * 2).sum()
    loss.backward()
    trainer.step(1)                      # creates the kvstore
    block = mx.gluon.nn.Dense(2, in_units=2)
    block.initialize()
    block.hybridize()
    block(mx.nd.ones((1, 2)))

    def sym_gen(key):
        return mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2), ("data",), None
    bucketing = mx.mod.BucketingModule(sym_gen, default_bucket_key=1)
    bucketing.bind(data_shapes=[("data", (1, 2))], for_training=False)
    from mxnet.contrib.amp import amp as reference
    return {
        "mxnet.base": mx.base, "mxnet.symbol.numpy": mx.sym.numpy,
        "mxnet.symbol.Symbol": mx.sym.var("x"), "mxnet.autograd": mx.autograd,
        "mxnet.autograd._RecordingStateScope": mx.autograd.record(),
        "mxnet.contrib.amp.amp": reference,
        "mxnet.optimizer.Optimizer": mx.optimizer.SGD(),
        "mxnet.gluon.Trainer": trainer, "mxnet.kvstore.KVStore": mx.kv.create("local"),
        "mxnet.gluon.HybridBlock": block, "mxnet.gluon.Parameter": p,
        "mxnet.module.BucketingModule": bucketing, "mxnet.ndarray.NDArray": mx.nd.ones((1,)),
    }


def test_every_private_name_mxamp_uses_exists_in_this_mxnet():
    """The contract: fails, naming what is missing, on an MXNet build that changed."""
    objects = _live_objects()
    unknown_owner = sorted({owner for owner, _ in mxnet_private.PRIVATE_NAMES} - set(objects))
    assert not unknown_owner, "no live object to check for: %s" % unknown_owner
    for owner, name in mxnet_private.PRIVATE_NAMES:
        obj = objects[owner]
        if owner == "mxnet.gluon.Trainer" and name in ("_amp_loss_scaler",
                                                       "_amp_original_scale"):
            # MXNet reads them (Trainer._update) but sets them only through AMP
            assert "_amp_loss_scaler" in open(mx.gluon.trainer.__file__).read(), \
                "MXNet's Trainer no longer reads %s" % name
            continue
        assert hasattr(obj, name), "this MXNet build (%s) has no %s.%s, which mxamp uses" % (
            mx.__version__, owner, name)
    assert len(mxnet_private.PRIVATE_NAMES) >= 40, mxnet_private.PRIVATE_NAMES


def _mxnet_private_names():
    """Every single-underscore attribute name of the MXNet objects mxamp deals with."""
    objects = _live_objects()
    names = set()
    for obj in list(objects.values()) + [type(o) for o in objects.values()] + [
            mx.nd.NDArray, mx.np.ndarray, mx.gluon.Block, mx.gluon.SymbolBlock,
            mx.optimizer.Updater]:
        names |= {n for n in dir(obj) if n.startswith("_") and not n.startswith("__")}
    return names


def test_no_module_but_the_boundary_touches_a_private_mxnet_name():
    private = _mxnet_private_names()
    # mxamp's own attributes that happen to share a name with something of MXNet's
    mine = {"_mxamp_generation", "_mxamp_started", "_mxamp_checkpointing",
            "_mxamp_o2_target"}
    offenders = []
    for module, path in module_files().items():
        if module == "mxamp.backend.mxnet_private":
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private and \
                    node.attr not in mine and not (isinstance(node.value, ast.Name) and
                                                   node.value.id in ("self", "cls")):
                offenders.append("%s:%d %s" % (module, node.lineno, node.attr))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "setattr", "hasattr", "delattr") and \
                    len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and \
                    node.args[1].value in private and node.args[1].value not in mine:
                offenders.append("%s:%d %r" % (module, node.lineno, node.args[1].value))
    assert not offenders, "private MXNet names outside mxamp.backend.mxnet_private: %s" % offenders


# ------------------------------------------------------------ one state, one reset
def test_reset_clears_every_piece_of_state(amp_off):
    amp.init("float16")
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize()
    trainer = mx.gluon.Trainer([p], "sgd", kvstore=None)
    amp.init_trainer(trainer)
    mx.nd.FullyConnected(mx.nd.ones((1, 2)), mx.nd.ones((2, 2)), no_bias=True, num_hidden=2)
    mx.sym.FullyConnected(mx.sym.var("d"), num_hidden=2)
    STATE.warned["notice"].add("a notice")
    summary = STATE.summary()
    assert summary["patched"] and summary["trainers"] == 1 and summary["tracked_symbols"] > 0
    assert summary["warned_ops"] == 1, "float16 GEMM on a CPU warns once"
    lock, generation = STATE.lock, STATE.generation
    amp.reset()
    after = STATE.summary()
    assert after == {"patched": False, "generation": generation + 1, "trainers": 0,
                     "warned_ops": 0, "notices": 0, "tracked_symbols": 0}, after
    assert STATE.lock is lock, "reset must not swap the lock another thread may hold"
    assert STATE.current_trainer() is None and STATE.disabled_depth() == 0
    assert len(STATE.recording_casts) == 0


def _mxnet_attributes():
    """``{(owner name, attribute): object}`` of every loaded MXNet module and of the classes
    mxamp may touch, read here without asking mxamp what it patches."""
    owners = {name: module for name, module in sys.modules.items()
              if module is not None and (name == "mxnet" or name.startswith("mxnet."))}
    owners.update({"NDArray": mx.nd.NDArray, "np.ndarray": mx.np.ndarray,
                   "HybridBlock": mx.gluon.HybridBlock, "Block": mx.gluon.Block,
                   "Trainer": mx.gluon.Trainer, "Optimizer": mx.optimizer.Optimizer,
                   "Updater": mx.optimizer.Updater, "Symbol": mx.sym.Symbol,
                   "RecordingScope": mx.autograd._RecordingStateScope})  # noqa: SLF001
    return {(name, attr): value for name, owner in owners.items()
            for attr, value in list(vars(owner).items())}


def test_reset_puts_back_every_attribute_mxamp_replaced(amp_off):
    """Everything mxamp does to MXNet (amp.init, a conversion, O2, a trainer, hybridized
    graphs built under the hooks) is undone by amp.reset(): every attribute of every MXNet
    module and of the classes involved is the very object it was before."""
    before = _mxnet_attributes()
    amp.init("bfloat16")
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3), mx.gluon.nn.BatchNorm(),
            mx.gluon.nn.Dense(2))
    net.initialize()
    net.hybridize()
    x = mx.nd.ones((1, 3, 8, 8))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore=None)
    amp.init_trainer(trainer)
    with mx.autograd.record():
        loss = net(x).sum()
        with amp.scale_loss(loss, trainer) as scaled:
            mx.autograd.backward(scaled)
    trainer.step(1)
    amp.convert_hybrid_block(net, "bfloat16")
    amp.reset()
    o2 = mx.gluon.nn.Dense(2, in_units=3)
    o2.initialize()
    amp.cast_model(o2, "bfloat16")
    assert o2.weight.data().dtype == BFLOAT16, "cast_model stored bfloat16 weights"
    y = mx.nd.ones((1, 3)).astype("bfloat16").astype("float32")   # the astype cast_model fixed
    assert y.asnumpy().tolist() == [[1.0, 1.0, 1.0]], "1.0 is exact in bfloat16"
    amp.reset()
    after = _mxnet_attributes()
    changed = sorted("%s.%s" % key for key in before if after.get(key, before) is not before[key])
    added = sorted("%s.%s" % key for key in after if key not in before and key[0] in
                   {k[0] for k in before})
    assert not changed, "amp.reset() left these MXNet attributes replaced: %s" % changed[:20]
    assert not added, "amp.reset() left these attributes added to MXNet: %s" % added[:20]
    assert STATE.replaced == []
    assert net(x).dtype == np.float32, "a graph built under AMP is rebuilt without its casts"


def test_reset_is_safe_under_threads(amp_off):
    errors = []
    stop = threading.Event()

    def worker():
        try:
            while not stop.is_set():
                with amp.disabled():
                    mx.nd.relu(mx.nd.ones((2,))).wait_to_read()
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):
            amp.init("bfloat16")
            amp.reset()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert not amp.is_initialized() and STATE.disabled_depth() == 0
    assert not hasattr(mx.nd.FullyConnected, "__mxamp_rule__") and \
        not hasattr(mx.sym.softmax, "__mxamp_rule__"), "originals restored"
