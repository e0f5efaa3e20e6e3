#!/usr/bin/env python
"""Run MXNet operators on bfloat16 (or float16) CPU inputs and report which ones really work.

mxamp's op lists may only call an op dtype-neutral, widest-type or low-precision for a target
when MXNet has a CPU kernel for that dtype. Some kernels are missing ("Unknown type enum 12"),
some give wrong numbers and some corrupt the heap (2-D/4-D ``transpose`` on bfloat16), which
kills the process later. So every op runs in its own forked child: the parent imports MXNet
once and never runs an op; a child runs one op on float32 and on the target dtype with the same
(pre-rounded) inputs, compares, churns the allocator to surface heap corruption, and reports
through a pipe. A child that dies is reported as a crash with the tail of its stderr.

Statuses: ``ok``; ``no_kernel`` (float32 works, the target raises); ``crash``; ``mismatch``
(values differ from float32 by more than the target's rounding allows); ``timeout``; ``dtype``
(runs but returns float32: fine for samplers, casts and index outputs); ``skipped`` (float32
fails too: the op needs a recipe, or has no tensor input).

Usage::

    python ci/probe_bf16_kernels.py                       # ops the bf16 lists run in bf16
    python ci/probe_bf16_kernels.py --all --dtype float16 # every forward op, float16
    python ci/probe_bf16_kernels.py --ops transpose,Embedding --out /tmp/probe.txt
    python ci/probe_bf16_kernels.py --backward            # input gradients instead of outputs

Exit status 1 when any probed op crashes, raises, times out or gives wrong numbers. It needs
no network and takes about four minutes on two cores for the ~420 ops of the bf16 lists.
The last full runs are kept in ``ci/probe_results_bfloat16.txt`` / ``..._float16.txt``.
"""
import argparse
import functools
import gc
import json
import os
import select
import signal
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
from mxamp.backend.forked import without_core_dump  # noqa: E402
from mxamp.backend.registry import op_info  # noqa: E402
from probe_recipes import RANDOM_OP, recipes_for  # noqa: E402  (lives beside us)

BFLOAT16 = np.dtype([("bfloat16", np.uint16)])

def _op_info(name):
    info = op_info(name)
    return info.handle, info.canonical, list(info.arguments), info.key_var_num_args


def is_backward(name):
    """True for the pure-backward helpers: a ``backward`` word anywhere in the name."""
    return "backward" in name.split("_")


def forward_ops():
    """{canonical name: sorted alias names} for every registered forward operator."""
    groups = {}
    for name in mx.operator.get_all_registered_operators():
        if is_backward(name):
            continue
        handle, canonical, _, _ = _op_info(name)
        groups.setdefault(canonical, set()).add(name)
    return {canon: sorted(names) for canon, names in groups.items()}


# ------------------------------------------- child side --------------------------------------
def _to_mx_dtype(dtype):
    return BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)


def _bf16_round(values):
    """Round float32 values to the nearest bfloat16 (so fp32 and bf16 runs see equal inputs)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def _as_float32(array):
    host = array.asnumpy()
    if host.dtype == BFLOAT16:
        flat = host.reshape(-1).view(np.uint16).astype(np.uint32) << 16
        return flat.view(np.float32).reshape(host.shape)
    return host.astype(np.float64) if host.dtype.kind in "fiub" else host


def _make_inputs(specs, dtype, rng, widest=False):
    """Host arrays (already rounded to ``dtype``) and the dtype each input is fed in.

    For a widest-type op every float input is fed in ``dtype`` (AMP makes them agree).
    """
    made = []
    for spec in specs:
        kind, shape = spec[0], spec[1]
        if kind in "fF":
            values = rng.uniform(0.5, 1.5, shape)
        elif kind == "n":
            values = rng.uniform(-1.0, 1.0, shape)
        elif kind == "b":
            values = rng.integers(0, 2, shape).astype(np.float64)
        else:
            values = rng.integers(0, spec[2], shape).astype(np.float64)
        values = values.astype(np.float32)
        feed = {"F": "float32", "i": "float32", "I": "int32"}.get(kind, dtype)
        if widest and kind in "Fi":
            kind, feed = "f", dtype
        if dtype == "bfloat16":
            values = _bf16_round(values) if kind in "fnb" else values
        elif dtype == "float16" and kind in "fnb":
            values = values.astype(np.float16).astype(np.float32)
        made.append((values, feed))
    return made


def _to_nd(values, feed):
    if feed == "bfloat16":
        return mx.nd.amp_cast(mx.nd.array(values, dtype="float32"), dtype=BFLOAT16)
    return mx.nd.array(values, dtype=feed)


#: Recipe input kinds that get gradients in ``--backward``: data and float32 parameters.
GRAD_KINDS = "fnF"


def _call(handle, arrays, kwargs, np_op):
    """The op's outputs, as a list (inside the caller's numpy-semantics scope)."""
    from mxnet._ctypes.ndarray import _imperative_invoke
    out = _imperative_invoke(handle, arrays, list(kwargs), [str(v) for v in kwargs.values()],
                             None, np_op, True)
    return out if isinstance(out, (list, tuple)) else [out]


def _invoke(handle, arrays, kwargs, np_op):
    with mx.util.np_shape(np_op), mx.util.np_array(np_op):
        return [(_as_float32(o), o.dtype) for o in _call(handle, arrays, kwargs, np_op)]


def _invoke_backward(handle, arrays, kwargs, np_op, kinds):
    """The gradients of the op's float outputs (unit head gradients) for its float inputs.

    ``kinds`` are the recipe's input kinds: those in :data:`GRAD_KINDS` get gradients,
    indices and masks do not. Returns ``[]`` when the op has no float output.
    """
    wrt = [i for i, kind in enumerate(kinds) if kind in GRAD_KINDS]
    for i in wrt:
        arrays[i].attach_grad()
    with mx.util.np_shape(np_op), mx.util.np_array(np_op):
        with mx.autograd.record():
            outs = _call(handle, arrays, kwargs, np_op)
        heads = [o for o in outs if o.dtype in (np.float32, np.float16, BFLOAT16)]
        if not heads:
            return []
        mx.autograd.backward(heads)
        grads = [(_as_float32(arrays[i].grad), arrays[i].grad.dtype) for i in wrt]
        mx.nd.waitall()  # a forward error nobody read surfaces here, not in the heap churn
        return grads


def _compare(ref, got, dtype, random_output, got_dtypes=None):
    """(status, detail): 'ok' when the target's outputs match the float32 ones.

    ``got_dtypes`` are the dtypes the target run must return (a gradient has its input's
    dtype); by default every output that is float32 in the reference is ``dtype``.

    The tolerance is loose on purpose (reductions inside an op add rounding): the probe looks
    for missing or broken kernels, whose errors are O(1) or NaN, not for last-bit accuracy.
    """
    tol = 0.05 if dtype == "bfloat16" else 0.01
    for number, ((ref_val, ref_dt), (got_val, got_dt)) in enumerate(zip(ref, got)):
        want = got_dtypes[number] if got_dtypes else (dtype if ref_dt == np.float32 else None)
        if want and got_dt != _to_mx_dtype(want):
            return "dtype", "output dtype %s, expected %s" % (got_dt, want)
        if ref_val.shape != got_val.shape:
            return "mismatch", "shape %s vs float32 %s" % (got_val.shape, ref_val.shape)
        if random_output or ref_val.size == 0:
            continue
        both_nan = np.isnan(ref_val) & np.isnan(got_val)
        same_inf = np.isinf(ref_val) & (ref_val == got_val)
        ref_val, got_val = (np.where(both_nan | same_inf, 0.0, v) for v in (ref_val, got_val))
        scale = max(1.0, float(np.max(np.abs(ref_val))) if np.isfinite(ref_val).all() else 1.0)
        err = float(np.max(np.abs(got_val - ref_val))) / scale
        if not np.isfinite(err) or err > tol:
            return "mismatch", "max relative error %.3g" % err
    return "ok", ""


def _child_probe(name, canonical, dtype, handle, fp32_when=None, widest=False,
                 backward=False):
    np_op = name.startswith(("_np", "_npi", "_npx"))
    random_output = bool(RANDOM_OP.search(canonical))
    recipes = recipes_for(name, canonical)
    if not recipes:
        return {"status": "skipped", "detail": "no tensor inputs"}
    tried, problems = 0, []
    rank = {"ok": 0, "dtype": 1, "mismatch": 2, "no_kernel": 3}
    for number, (specs, kwargs) in enumerate(recipes):
        if fp32_when and str(kwargs.get(fp32_when[0])) in fp32_when[1]:
            continue  # CONDITIONAL_FP32 runs this case in float32: nothing to check
        rng = np.random.default_rng(7 + number)
        host = _make_inputs(specs, dtype, rng, widest)
        extra = {"kinds": [spec[0] for spec in specs]} if backward else {}
        invoke = functools.partial(_invoke_backward if backward else _invoke, handle,
                                   kwargs=kwargs, np_op=np_op, **extra)
        try:
            ref = invoke([_to_nd(v, "float32" if f == dtype else f) for v, f in host])
            if backward and not ref:
                raise ValueError("no float output to differentiate")
        except Exception as err:  # noqa: BLE001 - recipe does not fit this op; try the next
            last_fp32_error = str(err).strip().splitlines()[-1][:160]
            _drain_errors()
            continue
        tried += 1
        try:
            got = invoke([_to_nd(v, f) for v, f in host])
        except Exception as err:  # noqa: BLE001
            status, detail = "no_kernel", str(err).strip().splitlines()[-1][:200]
            _drain_errors()
        else:
            status, detail = _compare(ref, got, dtype, random_output, backward and [
                feed for (_, feed), spec in zip(host, specs) if spec[0] in GRAD_KINDS])
        if status != "ok":
            shapes = "x".join(str(s[1]) for s in specs).replace(" ", "")
            problems.append((rank[status], status, "[%s %s] %s" % (
                shapes, ",".join("%s=%s" % kv for kv in sorted(kwargs.items())), detail)))
    if not tried:
        return {"status": "skipped", "detail": "float32 fails too: " + last_fp32_error}
    if problems:
        worst = max(problems)[1]
        return {"status": worst, "detail": "%d/%d recipes fail: %s" % (
            len(problems), tried, " | ".join(p[2] for p in problems))}
    return {"status": "ok", "detail": "%d recipe(s)" % tried}


def _drain_errors():
    """Wait for the engine and drop what it raises: a failed call can leave an asynchronous
    error behind (a forward that failed before a synchronous backward error), which would
    otherwise surface in the next recipe or in the heap churn."""
    try:
        mx.nd.waitall()
    except Exception:  # noqa: BLE001 - already reported through the synchronous error
        pass


def _churn_heap():
    """Allocate and free so that a corrupted heap aborts here, inside the child."""
    mx.nd.waitall()
    gc.collect()
    blocks = [np.ones(n) for n in range(1, 2000, 7)]
    arrays = [mx.nd.ones((n, 3)) for n in range(1, 64)]
    mx.nd.waitall()
    del blocks, arrays
    gc.collect()


# ------------------------------------------ parent side --------------------------------------
def probe(name, dtype, fp32_when=None, widest=False, timeout=60.0, backward=False):
    """Probe one op in a forked child; returns a result dict (status, detail).

    ``fp32_when`` is the op's CONDITIONAL_FP32 entry ``(parameter, values)``: recipes that set
    the parameter to one of the values are not run (AMP runs them in float32). ``widest``
    feeds every float input in ``dtype``, as AMP does for widest-type ops. ``backward``
    compares the input gradients instead of the outputs.
    """
    handle, canonical, _, _ = _op_info(name)
    return run_forked(name, functools.partial(_child_probe, name, canonical, dtype, handle,
                                              fp32_when, widest, backward), timeout)


def run_forked(name, child, timeout):
    """``child()`` (a JSON-able dict) run in a forked child; a crash, a timeout or an escaped
    exception becomes a result dict of its own. ``name`` goes into the result as ``op``."""
    read_fd, write_fd = os.pipe()
    err_file = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        without_core_dump()
        os.dup2(err_file.fileno(), 2)
        try:
            result = child()
            _churn_heap()
        except BaseException as err:  # noqa: BLE001 - report anything that escapes
            result = {"status": "error", "detail": repr(err)[:200]}
        os.write(write_fd, json.dumps(result).encode())
        os.close(write_fd)
        os._exit(0)
    os.close(write_fd)
    chunks, deadline, timed_out = [], time.time() + timeout, False
    while True:
        if time.time() > deadline:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select([read_fd], [], [], 1.0)
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    err_file.seek(0)
    err_tail = err_file.read().decode(errors="replace").strip().splitlines()[-1:]
    err_file.close()
    if timed_out:
        return {"op": name, "status": "timeout", "detail": "no answer in %.0f s" % timeout}
    if status != 0 or not chunks:
        how = ("signal %d" % os.WTERMSIG(status)) if os.WIFSIGNALED(status) else "exit"
        return {"op": name, "status": "crash",
                "detail": "%s: %s" % (how, err_tail[0][:160] if err_tail else "")}
    result = json.loads(b"".join(chunks).decode())
    result["op"] = name
    return result


def one_name_per_op(wanted, alias_of):
    """{canonical op: the one name of ``wanted`` to probe it under}: the canonical name where
    it is wanted, else the first wanted alias."""
    chosen = {}
    for name in sorted(wanted):
        canon = alias_of[name]
        if canon not in chosen or name == canon:
            chosen[canon] = name
    return chosen


def _listed_ops(dtype, categories):
    """The op names mxamp's lists for ``dtype`` hold in ``categories``, and their conditions."""
    from mxamp.lists import get_op_lists
    lists = get_op_lists(dtype)
    names = set()
    for category in categories:
        names |= set(getattr(lists, category))
    return names, dict(lists.conditional_fp32), set(lists.widest)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--all", action="store_true", help="probe every forward operator")
    parser.add_argument("--categories", default="neutral,widest,low_precision,conditional_fp32",
                        help="mxamp list categories to probe (default: all but fp32)")
    parser.add_argument("--ops", default="", help="comma-separated op names to probe")
    parser.add_argument("--out", default="", help="also write the results table here")
    parser.add_argument("--json", default="", help="also write the results as JSON here")
    parser.add_argument("--backward", action="store_true",
                        help="compare input gradients (autograd) instead of outputs")
    args = parser.parse_args(argv)

    ops = forward_ops()
    alias_of = {alias: canon for canon, names in ops.items() for alias in names}
    listed, conditions, widest = _listed_ops(args.dtype, args.categories.split(","))
    if args.ops:
        wanted = set(args.ops.split(","))
    elif args.all:
        wanted = set(alias_of)
    else:
        wanted = listed
    unknown = sorted(wanted - set(alias_of))
    if unknown:
        parser.error("not registered forward operators: %s" % ", ".join(unknown))
    chosen = one_name_per_op(wanted, alias_of)
    results, start = [], time.time()
    for canon in sorted(chosen, key=str.lower):
        result = probe(chosen[canon], args.dtype, conditions.get(chosen[canon]),
                       chosen[canon] in widest, backward=args.backward)
        result["aliases"] = [n for n in ops[canon] if n != result["op"]]
        results.append(result)
        print("%-48s %-9s %s" % (result["op"], result["status"], result["detail"]), flush=True)
    counts = {}
    for result in results:
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    summary = "# %s%s: %d ops probed in %.0f s: %s" % (
        args.dtype, " backward" if args.backward else "", len(results), time.time() - start,
        ", ".join("%s %d" % kv for kv in sorted(counts.items())))
    print(summary)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(summary + "\n")
            for r in results:
                handle.write("%-48s %-9s %s\n" % (r["op"], r["status"], r["detail"]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    bad = [r for r in results
           if r["status"] in ("crash", "no_kernel", "mismatch", "timeout", "error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
