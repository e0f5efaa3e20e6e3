"""Per-model tuning: time the user's model under a few precision policies, keep the fastest that
is not slower than float32, and apply it.

Where bfloat16 pays depends on the model as much as on the CPU (NOTES.md §2, §2b): on a Zen 5
ResNet-18 trains 1.05x faster in bfloat16 everywhere but 1.25-1.36x with its stem convolution in
float32; on a Sapphire Rapids with AMX, MobileNet trains 15x slower in bfloat16 (BatchNorm
backward) and ResNet-50 2.3x faster. :func:`tune` measures instead of guessing:

>>> import mxnet as mx
>>> from mxamp import amp
>>> net = mx.gluon.nn.HybridSequential()
>>> net.add(mx.gluon.nn.Conv2D(8, 3, in_channels=3), mx.gluon.nn.Dense(4))
>>> net.initialize(); net.hybridize()
>>> policy = amp.tune(net, mx.nd.ones((2, 3, 8, 8)), report=None)   # doctest: +SKIP
>>> policy.name in ('float32', 'bfloat16')                          # doctest: +SKIP
True

A :class:`Policy` is data: the target dtype and op lists that ``amp.init`` and ``convert_*``
take (``policy.init_kwargs()``), saved beside the model (``policy.save(path)``,
``Policy.load(path)``) and explained (``policy.explain()``). Candidates come from the model's
graph: bfloat16 everywhere, and bfloat16 with float32 for the stem convolution (few input
channels), depthwise convolutions, BatchNorm, where the model has them. Tuning runs forward and
backward passes (or forward only, ``train=False``), each candidate in a forked copy of the
process (:mod:`mxamp.backend.forked`): what a trial allocates ends with its copy, and the model
in this process is never touched. Where trials run in the process (a GPU, no ``os.fork``,
``MXAMP_TUNE_FORK=0``), every parameter, gradient and BatchNorm statistic is restored
afterwards, so the model's numbers do not change either way.
"""
import math
import sys

import mxnet as mx

from mxamp.backend import env
from mxamp.backend.devices import GPU, device_of
from mxamp.backend.forked import FORK_AVAILABLE, ForkedCallDied, call_in_fork
from mxamp.precision.device_plan import target_for
from mxamp import dtypes
from mxamp.patching import patcher as patching
from mxamp.precision import plan
from mxamp.errors import AmpArgumentError, as_input_tuple
from mxamp.lists.conditions import Condition
from mxamp.backend.mxnet_private import NumpySymbol, ParamView
from mxamp.precision.policy import FLOAT32, Policy, format_table
from mxamp.backend.graphs import data_shapes_of, graph_nodes
from mxamp.backend.heap import release_free_memory
from mxamp.runtime.casting import cast
from mxamp.backend.timing import costliest_ops, profile_file, time_calls

#: A candidate must beat float32 by this margin to be kept (timing noise on small steps).
MIN_GAIN = 1.02
#: A candidate whose timed pass is this much slower than the fastest so far gets no more passes.
RACE_MARGIN = 1.25
#: Timed passes of one candidate stop once they add up to this (ResNet-50 on 2 cores: one
#: pass of ~5 s; consecutive passes differ by ~2% there, within MIN_GAIN).
ENOUGH_SECONDS = 1.0
#: Conditions candidates use (``conditional_fp32_ops`` entries, see mxamp.lists.conditions).
STEM = ("in_channels", ["<=4"])
DEPTHWISE = ("depthwise", ["True"])
_CONV_OPS = ("Convolution", "_npx_convolution")
_BN_OPS = ("BatchNorm", "_npx_batch_norm", "_contrib_BatchNormWithReLU")


def _graph_ops(net, example, train=True):
    """([(attrs, data shape or None)] of the convolutions, {op names}) of the graph."""
    args = as_input_tuple(example)
    names = ["data%d" % i if len(args) > 1 else "data" for i in range(len(args))]
    # a model written for numpy semantics (npx.set_np()) takes numpy symbols, as its arrays
    inputs = [mx.sym.var(n).as_np_ndarray() if isinstance(a, mx.np.ndarray) else mx.sym.var(n)
              for n, a in zip(names, args)]
    mode = mx.autograd.train_mode() if train else mx.autograd.predict_mode()
    with patching.disabled(), mode:   # the graph of the pass that is timed
        sym = net(*inputs)
    if isinstance(sym, (list, tuple)):
        sym = mx.sym.Group([s.as_nd_ndarray() if isinstance(s, NumpySymbol) else s
                            for s in _flat_symbols(sym)])
    shapes = {n: a.shape for n, a in zip(names, args)}
    nodes = graph_nodes(sym)
    convs = [n for n in nodes if n["op"] in _CONV_OPS]
    conv_shapes = data_shapes_of(sym, convs, shapes)
    return ([(n.get("attrs", {}), conv_shapes[n["name"]]) for n in convs],
            {n["op"] for n in nodes})


def _leaves(value):
    """The leaves of a nested output (detectors return tuples of tuples of losses)."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _flat_symbols(value):
    return [s for s in _leaves(value) if isinstance(s, mx.sym.Symbol)]


def candidates(net, example, target, train=True):
    """The policies worth timing for this model (float32 first).

    >>> net = mx.gluon.nn.HybridSequential()
    >>> net.add(mx.gluon.nn.Conv2D(8, 3, in_channels=3), mx.gluon.nn.BatchNorm())
    >>> net.initialize()
    >>> [p.name for p in candidates(net, mx.nd.ones((1, 3, 8, 8)), 'bfloat16')]
    ['float32', 'bfloat16', 'bfloat16, stem in float32', 'bfloat16, BatchNorm in float32']
    """
    convs, ops = _graph_ops(net, example, train)
    out = [Policy("float32", "float32"), Policy(target, target)]
    # the same tests the conditions apply at run time (mxamp.lists.conditions)
    stem, depthwise = (Condition((STEM,)), Condition((DEPTHWISE,)))
    has_stem = any(stem.holds(attrs, shape) for attrs, shape in convs)
    has_dw = any(depthwise.holds(attrs, shape) for attrs, shape in convs)
    if has_stem:
        out.append(Policy("%s, stem in float32" % target, target,
                          conditional_fp32_ops=[["Convolution"] + list(STEM)]))
    if has_dw:
        out.append(Policy("%s, depthwise in float32" % target, target,
                          conditional_fp32_ops=[["Convolution"] + list(DEPTHWISE)]))
    if has_stem and has_dw:
        # one rule per op: the conv_kind word names both
        out.append(Policy("%s, stem+depthwise in float32" % target, target,
                          conditional_fp32_ops=[["Convolution", "conv_kind",
                                                 ["stem", "depthwise"]]]))
    if ops & set(_BN_OPS):
        out.append(Policy("%s, BatchNorm in float32" % target, target,
                          extra_fp32_ops=sorted(_BN_OPS)))
    return out


class _Snapshot:
    """What timing a policy changes in the model, to restore: the gradients that hold values
    and every parameter that takes no gradient (BatchNorm's running statistics). Forward and
    backward passes never write the other weights, so they are not copied (a copy of every
    weight and gradient doubled the model's memory while tuning)."""

    def __init__(self, net):
        self.saved = []
        for param in net.collect_params().values():
            view = ParamView(param)
            if view.data is None:
                continue
            data = [d.copy() for d in view.data] if param.grad_req == "null" else None
            grad = None
            if view.grad is not None:
                # None: all zero (a fresh model's), restored by zeroing, nothing kept
                grad = [None if _all_zero(g) else g.copy() for g in view.grad]
            self.saved.append((view, data, grad))

    def restore(self):
        """Put the saved values back into the model's own arrays, and forget them."""
        for view, data, grad in self.saved:
            for dst, src in zip(view.data, data or ()):
                src.copyto(dst)
            for dst, src in zip(view.grad or (), grad or ()):
                if src is None:
                    dst[:] = 0
                else:
                    src.copyto(dst)
        mx.nd.waitall()
        self.saved = []


def _all_zero(array):
    if array.stype != "default":
        return False
    return float(cast(array.abs().max(), "float32").asscalar()) == 0.0


def _step_fn(net, example, loss_fn, train):
    args = as_input_tuple(example)

    def step():
        if not train:
            with mx.autograd.predict_mode():
                outs = net(*args)
        else:
            with mx.autograd.record():
                outs = net(*args)
                loss = loss_fn(outs) if loss_fn is not None else outs
                # cast inside the recording: a loss cast after it is outside the graph, and
                # backward from it fails ("Cannot differentiate node ...")
                losses = [l if dtypes.name_of(l.dtype) == "float32" else l.astype("float32")
                          for l in _leaves(loss)]
            mx.autograd.backward(losses)
        mx.nd.waitall()
        return outs
    return step


def _worth_timing(policy, rows, target):
    """Whether a variant can still win, from what was timed so far (fewer passes on big models).

    BatchNorm in float32 only where BatchNorm is among the target's 5 costliest ops (its slow
    backward under AMX); stem+depthwise only where each alone beat the target everywhere."""
    by_name = {r["name"]: r for r in rows}
    low = by_name.get(target)
    if policy.name in ("float32", target) or low is None:
        return True
    if policy.extra_fp32_ops:
        return any("BatchNorm" in name or "batch_norm" in name
                   for name, _ in low.get("top_ops", []))
    if policy.name.endswith("stem+depthwise in float32"):
        singles = [by_name.get("%s, %s in float32" % (target, part))
                   for part in ("stem", "depthwise")]
        return all(r is not None and r["ms"] < low["ms"] for r in singles)
    return True


def _time_policy(policy, step, steps, profile, give_up_ms=math.inf,
                 enough_seconds=ENOUGH_SECONDS):
    """(ms per step, top ops) of ``step`` under ``policy``: one warm-up, then up to ``steps``
    timed passes, fewer once the best is slower than ``give_up_ms`` (it cannot win) or the
    timed passes add up to ``enough_seconds`` (a long pass is its own average)."""
    patching.reset()
    if policy.target != FLOAT32:
        patching.init(policy=policy)
    step()  # warm-up: the graph is rebuilt for this policy, oneDNN primitives are created
    if profile:
        mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                               filename=profile_file())
        mx.profiler.set_state("run")
    timing = None
    try:
        timing = time_calls(step, repeats=steps, warmup=0, at_most=steps,
                            stop=lambda s: min(s) * 1e3 > give_up_ms or sum(s) >= enough_seconds)
    finally:
        top = []
        if profile:
            mx.profiler.set_state("stop")
            top = costliest_ops(mx.profiler.dumps(reset=True, format="json"),
                                len(timing.samples) if timing else 0)
    return timing.best * 1e3, top


def tune(net, example_batch, loss_fn=None, trainer=None, target_dtype="auto", train=True,
         steps=2, candidates_=None, apply=True, profile=True, report=sys.stdout):
    """Time ``net`` under candidate policies and return (and apply) the fastest :class:`Policy`
    that is not slower than float32.

    ``example_batch`` is an NDArray or a tuple of them (one per forward argument); ``loss_fn``
    maps the outputs to the loss (default: the outputs themselves); ``train=False`` times
    inference. ``trainer`` is accepted for symmetry with training scripts and left untouched.
    Each candidate runs in a forked copy of the process (the module's docstring) and costs one
    warm-up and up to ``steps`` timed passes (one where a pass takes ``ENOUGH_SECONDS`` or more,
    or is ``RACE_MARGIN`` slower than the fastest so far); a copy that dies is a failed row.
    Where nothing computes in the target, only float32 is timed. Variants that cannot win are
    not timed: BatchNorm in float32 only where BatchNorm is among the target's 5 costliest ops,
    stem+depthwise only where each alone beat the target (``candidates_`` given: every one is
    timed). Tuning resets AMP; with ``apply=True`` the chosen policy is then put in force with
    ``amp.init`` (float32: AMP stays off), with ``apply=False`` AMP is left off.
    The table (policy, ms per step, ratio to float32, the 5 costliest ops) goes to ``report``
    (None: silent) and to ``policy.table``.
    """
    batch = _checked_batch(net, example_batch, steps)
    device = device_of(batch[0].context)
    # what the target itself computes here ('auto' is what is being decided, by timing)
    target = target_for(target_dtype, device)
    here = plan.make(target, [device]).primary
    policies = _policies_to_time(net, batch, target, here, train, candidates_)
    rows, policies = _time_policies(net, batch, policies, loss_fn, train, steps, profile, target,
                                    prune=candidates_ is None)
    best, why = _choose(rows, here, target)
    chosen = policies[best]
    chosen.table, chosen.device, chosen.why = rows, device, why
    if report is not None:
        _write_report(report, rows, device, here, target, best)
    if apply and chosen.target != FLOAT32:
        patching.init(policy=chosen)
    return chosen


def _checked_batch(net, example_batch, steps):
    """``example_batch`` as a tuple of NDArrays; a bad ``net``, batch or ``steps`` raises."""
    if not isinstance(net, mx.gluon.Block):
        raise AmpArgumentError("tune needs a gluon Block, got %s" % type(net).__name__)
    batch = as_input_tuple(example_batch, "example_batch must be an NDArray or a tuple of NDArrays",
                           empty_ok=False)
    if steps < 1:
        raise AmpArgumentError("steps must be at least 1, got %r" % (steps,))
    return batch


def _policies_to_time(net, batch, target, here, train, candidates_):
    """The user's candidates, or the model's (float32 alone where nothing computes in the
    target on this device)."""
    policies = candidates_ or candidates(net, batch, target, train)
    if not here.low_precision and candidates_ is None:
        # nothing can compute in the target here: every candidate is the same float32
        # computation, so only float32 is timed (for the table and its costliest ops)
        policies = policies[:1]
    return policies


def _finish_deferred_init(net, batch):
    """Give deferred parameters their shapes, so that the snapshot holds every parameter and
    BatchNorm statistic that the timing changes (in this process: a float32 inference pass of
    the batch, whose activations raise the process's peak)."""
    if any(ParamView(p).data is None for p in net.collect_params().values()):
        # an inference pass initialises them and changes no statistic
        with patching.disabled(), mx.autograd.predict_mode():
            net(*batch)


def _time_policies(net, batch, policies, loss_fn, train, steps, profile, target, prune):
    """(table rows, policies timed): each policy timed in turn (with ``prune``, variants that
    cannot win are skipped), then AMP reset (and, for trials run in the process, the model's
    numbers restored). Trials run in forked copies on a CPU where Python can fork, unless
    ``MXAMP_TUNE_FORK=0`` (CUDA does not survive a fork)."""
    forked = (FORK_AVAILABLE and device_of(batch[0].context) != GPU
              and env.flag("MXAMP_TUNE_FORK"))
    snapshot = None
    if not forked:   # a forked copy finishes deferred initialisation in its own first pass
        _finish_deferred_init(net, batch)
        snapshot = _Snapshot(net)
    step = _step_fn(net, batch, loss_fn, train)
    if profile:
        profile_file()   # the folder is this process's, removed when it exits
    rows, timed = [], []
    try:
        for policy in policies:
            if prune and not _worth_timing(policy, rows, target):
                continue
            fastest = min((r["ms"] for r in rows if not r.get("error")), default=math.inf)
            rows.append(_trial(policy, step, steps, profile, RACE_MARGIN * fastest, forked))
            timed.append(policy)
    finally:
        patching.reset()
        if snapshot is not None:   # forked trials left nothing in this process to give back
            snapshot.restore()
            release_free_memory()
    return rows, timed


def _trial(policy, step, steps, profile, give_up_ms, forked):
    """``policy``'s table row, timed in a forked copy of the process where ``forked``. A copy that
    dies (a crash in a kernel) gives a failed row, never chosen; float32's is re-raised, since
    without it nothing can be compared."""
    def timed():
        return _time_policy(policy, step, steps, profile, give_up_ms=give_up_ms)

    if not forked:
        ms, top = timed()
        release_free_memory()   # the next trial reuses pages, not the heap's high mark
    else:
        try:
            ms, top = call_in_fork(timed)
        except ForkedCallDied as died:
            if policy.target == FLOAT32:
                raise ForkedCallDied(
                    "tune: while timing float32, %s; without AMP nothing can be compared: run "
                    "one float32 step to see why" % died) from None
            return {"name": policy.name, "ms": 0.0, "top_ops": [], "error": str(died)}
    return {"name": policy.name, "ms": round(ms, 2), "top_ops": top}


def _choose(rows, here, target):
    """(index of the chosen row, why): each row gets its speed ratio to float32 (the first row)
    and the chosen one is marked; float32 unless a policy beats it by ``MIN_GAIN``."""
    base = rows[0]["ms"]
    for row in rows:
        row["ratio"] = round(base / row["ms"], 3) if row["ms"] else 0.0
    best = max(range(len(rows)), key=lambda i: rows[i]["ratio"])
    if not here.low_precision:
        best, why = 0, "nothing computes in %s here (%s)" % (target, here.reason)
    elif rows[best]["ratio"] < MIN_GAIN:
        # nothing beats float32 by more than the noise: keep float32 compute
        runner_up = max((r["ratio"] for r in rows[1:]), default=0.0)
        best, why = 0, "nothing was faster than float32 for this model (best other: %.2fx)" % (
            runner_up)
    else:
        why = "%.2fx float32's speed for this model, the fastest of %d policies timed" % (
            rows[best]["ratio"], len(rows))
    rows[best]["chosen"] = True
    return best, why


def _write_report(report, rows, device, here, target, best):
    """Write the table of timed policies to ``report``, and why float32 stays where it does."""
    why = "" if here.low_precision else " (%s)" % here.reason
    report.write("mxamp tune on %s%s:\n%s\n" % (
        "a GPU" if device == GPU else "a CPU of class %r" % device, why,
        format_table(rows)))
    if not here.low_precision:
        report.write("  nothing computes in %s here: keeping float32 compute\n" % target)
    elif best == 0:
        report.write("  nothing was faster than float32 here: keeping float32 compute\n")
