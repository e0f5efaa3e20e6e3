"""Ops with no working bfloat16 CPU kernel on any class stay float32 whatever an override says.

MXNet 1.9.1's bfloat16 ``transpose`` corrupts the heap on every CPU class. Measured on the Zen 4,
50 transposes of a 64x48 bfloat16 array: "malloc(): corrupted top size" natively and under
``DNNL_MAX_CPU_ISA=AVX512_CORE``, a segfault under ``AVX2``. mxamp's bfloat16 fp32 list holds
it, but an ``fp32_ops`` override replaces that list, and before this rule the ops it dropped
became dtype-neutral: ``amp.init('bfloat16', fp32_ops=['dot'])`` then aborted the process at the
first bfloat16 tensor that reached a transpose ("free(): corrupted unsorted chunks").

Runs that may abort go to a child process.
"""
import json
import subprocess
import sys
import warnings

import mxnet as mx
import pytest

from bf16_expect import where
from mxamp import amp

TRANSPOSES = """
import contextlib
import mxnet as mx
from mxamp import amp, dtypes
SETUP
x = mx.nd.amp_cast(mx.nd.ones((64, 48)), dtype=dtypes.BFLOAT16)
with CONTEXT:
    for _ in range(50):
        y = mx.nd.transpose(mx.nd.transpose(x))
    mx.nd.waitall()
print("RESULT", mx.nd.transpose(x).dtype.__name__, y.shape)
"""


def _run(setup, context="amp.disabled() if DISABLED else contextlib.nullcontext()"):
    """(return code, stdout, stderr) of the script; a corrupted heap may also hang in malloc
    (twice in about eight runs here): a run past 20 s counts as failed (it takes about 2 s)."""
    script = TRANSPOSES.replace("SETUP", setup).replace("CONTEXT", context)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=20)
    except subprocess.TimeoutExpired:
        return -1, "", "hung for 20 s"
    return done.returncode, done.stdout, done.stderr


@pytest.mark.cpu_class
def test_raw_bfloat16_transpose_still_corrupts_the_heap():
    """The fact the rule rests on, checked where the suite runs: without AMP the same script
    dies. If it ever runs, MXNet fixed its kernel and transpose can leave the rule."""
    returncode, _, _ = _run("", context="contextlib.nullcontext()")
    assert returncode != 0, ("a bfloat16 transpose ran without AMP %s: the kernel may be "
                             "fixed; revisit FP32_ON_EVERY_CPU" % where())


@pytest.mark.cpu_class
@pytest.mark.parametrize("disabled", [False, True], ids=["amp-on", "inside-disabled"])
def test_an_fp32_override_keeps_transpose_off_bfloat16(disabled):
    """``fp32_ops=['dot']`` replaces the fp32 list; transpose still computes in float32, and
    inside ``amp.disabled()`` too (a bfloat16 kernel that corrupts memory is never run)."""
    returncode, out, err = _run("amp.init('bfloat16', fp32_ops=['dot'])\nDISABLED = %s" % disabled)
    assert returncode == 0, "the process failed %s: %s" % (where(), err[-600:])
    result = [line for line in out.splitlines() if line.startswith("RESULT")][-1]
    assert result == "RESULT float32 (64, 48)", result


def test_a_target_precision_override_naming_transpose_warns_and_keeps_float32(amp_off):
    """Checks decisions only (nothing is transposed): the user asked for a bfloat16 transpose;
    mxamp computes it in float32 and says why, naming the op."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        amp.init("bfloat16", target_precision_ops=["FullyConnected", "transpose"])
    said = [str(w.message) for w in caught if "target_precision_ops names" in str(w.message)]
    assert len(said) == 1 and "transpose (bfloat16 kernel corrupts the heap" in said[0], said
    assert amp.precision_of("transpose", data_shape=(4, 8))[0] == "float32"


def test_a_converted_graph_casts_transpose_to_float32_under_an_fp32_override():
    """convert_symbol with a replacing ``fp32_ops``: the transpose node reads a float32 cast of
    the bfloat16 FullyConnected output (a graph pass reads the same plan)."""
    data = mx.sym.var("data")
    fc = mx.sym.FullyConnected(data, num_hidden=16, name="fc")
    out = mx.sym.transpose(fc, name="t")
    converted = amp.convert_symbol(out, target_dtype="bfloat16", fp32_ops=["dot"])
    graph = json.loads(converted.tojson(remove_amp_cast=False))["nodes"]
    t = next(n for n in graph if n["name"] == "t")
    feeding = graph[t["inputs"][0][0]]
    assert (feeding["op"], feeding["attrs"].get("dtype")) == ("amp_cast", "float32"), feeding
