"""Probe oneDNN's AMX bfloat16 1x1 convolutions for the heap corruption measured on Sapphire Rapids.

Each shape runs in a forked child (a corrupted heap kills only the child) with glibc's heap
checks on, as a bfloat16 Convolution under AMX, and is compared with float32. It runs the family
mxamp guards (``mxamp/lists/bfloat16.py``, ``FP32_WHEN_BY_CPU_CLASS['amx']``: 1x1 stride-1,
per-image H*W 27..48 in steps of 3 but 30, C_in a multiple of 32) and a scan around it, then
compares what failed with the guard:

* a shape that fails outside the guard is a hole in mxamp's rule: exit 1;
* no shape of the known family failing means this oneDNN/MXNet no longer has the bug: the
  guard can go (exit 0, and it says so).

Needs a CPU with AMX (``amx_bf16``) and Linux's tile permission; elsewhere it says why it was
skipped and exits 0. ``.ci/run`` runs it on AMX machines.

    python ci/probe_amx.py            # the known family and a scan around it (~1 min; up to
                                      # 10 s more for each child that hangs)
    python ci/probe_amx.py --quick    # the known family only
"""
import argparse
import os
import signal
import sys
import time

# No engine threads (fork is safe), one OpenMP thread, glibc aborts at the first bad free.
os.environ["MXNET_ENGINE_TYPE"] = "NaiveEngine"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["MALLOC_CHECK_"] = "3"
os.environ["MXAMP_AMX"] = "1"   # the default, said explicitly: this probe needs AMX

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The measured family (NOTES.md section 2): per-image H*W that corrupted the heap at C_in 64.
KNOWN_SIZES = (27, 33, 36, 39, 42, 45, 48)


def run_shape(c_in, height, width, batch=1, c_out=64):
    """Relative max error of a bfloat16 1x1 conv against float32 (in this process)."""
    import mxnet as mx
    import numpy as np
    from mxamp import dtypes
    conv = getattr(mx.nd.Convolution, "__wrapped__", mx.nd.Convolution)
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.randn(batch, c_in, height, width))
    w = mx.nd.array(rng.randn(c_out, c_in, 1, 1) * 0.1)
    args = dict(kernel=(1, 1), stride=(1, 1), num_filter=c_out, no_bias=True)
    ref = conv(x, w, **args).asnumpy()
    low = None
    for _ in range(2):
        low = conv(mx.nd.amp_cast(x, dtype=dtypes.BFLOAT16),
                   mx.nd.amp_cast(w, dtype=dtypes.BFLOAT16), **args)
    got = mx.nd.amp_cast(low, dtype="float32").asnumpy()
    return float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-9))


#: A shape's child that has not ended by then is stopped and counted as failed. A child that
#: runs computes in milliseconds; on the AMX host lent on 2026-11-26 crashing children took
#: about 45 s each to end, idle (1 min 30 s of wall time, 3.8 s of CPU, for two shapes).
CHILD_SECONDS = 10


def in_child(shape):
    """'ok', 'WRONG', 'ERROR', 'CRASH (signal)' or 'HUNG' for one shape, in a forked child."""
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        from mxamp.backend.forked import without_core_dump
        without_core_dump()
        try:
            os._exit(0 if run_shape(*shape) < 0.05 else 3)
        except Exception:  # noqa: BLE001 - reported as an MXNet error
            os._exit(4)
    deadline = time.monotonic() + CHILD_SECONDS
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "HUNG (%d s)" % CHILD_SECONDS
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    return {0: "ok", 3: "WRONG", 4: "ERROR"}.get(code, "CRASH (%d)" % code)


def guarded(c_in, height, width):
    """Whether mxamp's amx rule keeps this convolution in float32."""
    from mxamp.lists import get_op_lists
    rules = get_op_lists("bfloat16").fp32_when("amx").get("Convolution", ())
    attrs = {"kernel": (1, 1), "stride": (1, 1)}
    return any(c.holds(attrs, (1, c_in, height, width)) for c in rules)


def shapes(quick):
    family = [(c, 1, hw) for c in (32, 64, 512) for hw in KNOWN_SIZES]
    if quick:
        return family
    around = [(64, 1, hw) for hw in range(1, 97)]                  # H*W around and beyond
    channels = [(c, 6, 6) for c in (16, 32, 48, 64, 80, 96, 128, 256)]  # C_in at 6x6
    square = [(64, h, h) for h in range(2, 10)]                    # square images
    return list(dict.fromkeys(family + around + channels + square))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the known family only")
    args = parser.parse_args()
    flags = open("/proc/cpuinfo").read()
    if "amx_bf16" not in flags:
        print("probe_amx: skipped: this CPU has no AMX (amx_bf16)")
        return 0
    import mxamp  # noqa: F401 - grants the tiles and latches the AMX ISA
    from mxamp.backend import cpu
    features = cpu.cpu_features()
    print("probe_amx: class %r, AMX in effect: %s (%s)" % (
        features.bf16_class, features.amx_in_effect, features.amx_check or features.reason))
    if not features.amx_in_effect:
        print("probe_amx: skipped: AMX is not in effect in this process")
        return 0
    failed, holes = [], []
    for shape in shapes(args.quick):
        verdict = in_child(shape)
        if verdict != "ok":
            failed.append(shape)
            if not guarded(*shape):
                holes.append(shape)
        print("  C_in=%-4d %dx%-3d H*W=%-4d %-12s %s" % (
            shape[0], shape[1], shape[2], shape[1] * shape[2], verdict,
            "guarded" if guarded(*shape) else ""), flush=True)
    family_failed = [s for s in failed if s[1] * s[2] in KNOWN_SIZES and s[0] % 32 == 0]
    print("probe_amx: %d of %d shapes failed; %d outside mxamp's guard" % (
        len(failed), len(shapes(args.quick)), len(holes)))
    if holes:
        print("probe_amx: FAIL: the amx rule misses %s" % holes)
        return 1
    if not family_failed:
        print("probe_amx: the known family passes here: this oneDNN no longer corrupts the "
              "heap; the amx rule in mxamp/lists/bfloat16.py can be dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
