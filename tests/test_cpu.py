"""The CPU model (mxamp.backend.cpu): the bfloat16 class oneDNN uses, and AMX enablement.

Two kinds of test. The class model itself (:func:`mxamp.backend.cpu.classify_bf16`) is a pure
function of CPU flags, the ISA cap and the build: it is checked for every class with synthetic
flag sets, on any machine (no ``cpu_class`` marker). Then, in fresh interpreters (oneDNN fixes
its ISA once per process), the class mxamp decides is checked against what oneDNN itself reports
(``DNNL_VERBOSE=1``) and does with a bfloat16 FullyConnected, with and without ISA caps: on an
AVX-512 machine the AVX2 cap must reproduce the AVX2 machine's behaviour. Which branch ran is
printed. Hardware facts come from oneDNN, ``bf16_expect`` and Linux, never from mxamp.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import bf16_expect
from mxamp.backend import amx, cpu
from side_by_side import map_side_by_side

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints the features and how close a bf16 FullyConnected comes to fp32 (fixed seed), or the
# error oneDNN gave where it has no bfloat16 kernel.
BF16_FC_PROBE = """
import json, os
import numpy as np
import mxnet as mx
from mxamp import dtypes
from mxamp.backend import cpu
rng = np.random.RandomState(0)
x = mx.nd.array(rng.uniform(-1, 1, (64, 256)))
w = mx.nd.array(rng.uniform(-1, 1, (128, 256)))
ref = mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=128).asnumpy()
rel, error = None, None
try:
    low = mx.nd.FullyConnected(mx.nd.amp_cast(x, dtype=dtypes.BFLOAT16),
                               mx.nd.amp_cast(w, dtype=dtypes.BFLOAT16), no_bias=True,
                               num_hidden=128)
    out = mx.nd.amp_cast(low, dtype='float32').asnumpy()
    rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
except mx.base.MXNetError as err:
    error = str(err).splitlines()[0]
print('RESULT ' + json.dumps(dict(features=cpu.cpu_features().as_dict(), rel_error=rel,
                                  error=error, env_isa=os.environ.get('DNNL_MAX_CPU_ISA'))),
      flush=True)
"""


def _run(code, **env_changes):
    """Runs ``code`` in a fresh interpreter with DNNL_VERBOSE=1.

    Returns the dict the child printed after ``RESULT ``, oneDNN's verbose lines and stderr.
    """
    # The class under test (CI's DNNL_MAX_CPU_ISA cap or MXAMP_AMX opt-out) reaches the child;
    # a test that needs its own setting passes it in env_changes ("" removes a variable).
    env = {k: v for k, v in os.environ.items() if k not in (cpu.DISABLE_ENV, "MKLDNN_MAX_CPU_ISA")}
    env.update(DNNL_VERBOSE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    env.update(env_changes)
    env = {k: v for k, v in env.items() if v != ""}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, "child failed (rc %d):\n%s" % (proc.returncode, proc.stderr[-3000:])
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    results = [json.loads(l[len("RESULT "):]) for l in lines if l.startswith("RESULT ")]
    assert len(results) == 1, "child printed no RESULT line:\n%s" % proc.stdout[-3000:]
    return results[0], [l for l in lines if l.startswith("dnnl_verbose")], proc.stderr


def _isa_line(verbose):
    lines = [l for l in verbose if l.startswith("dnnl_verbose,info,cpu,isa:")]
    assert len(lines) == 1, "oneDNN printed %d ISA lines, expected one: %s" % (len(lines), lines)
    return lines[0]


def _bf16_inner_product_impls(verbose):
    """oneDNN's implementations of the bf16 FullyConnected that ran (empty where none could)."""
    return {l.split(",")[4] for l in verbose
            if l.startswith("dnnl_verbose,exec,cpu,inner_product") and "src_bf16" in l}


def _machine_can_use_amx():
    """Independent of mxamp: the documented table gives class 'amx' with mxamp's AMX switch on
    (the children set it themselves), and Linux grants the tiles."""
    environ = {k: v for k, v in os.environ.items() if k not in ("MXAMP_AMX", "MXAMP_DISABLE_AMX")}
    return bf16_expect.class_here(environ) == "amx"


def _assert_bf16_matches_class(result, verbose):
    """What oneDNN did with the bf16 FullyConnected is what the class mxamp decided says."""
    features = result["features"]
    bf16_class, isa = features["bf16_class"], _isa_line(verbose)
    print("bf16 class %r (%s); %s" % (bf16_class, features["bf16_reason"], isa))
    if bf16_class == "none":
        assert result["error"] and "primitive descriptor" in result["error"], (
            "class 'none' means oneDNN has no bf16 FullyConnected, yet it ran (%s)" % isa)
        assert not _bf16_inner_product_impls(verbose)
        return
    assert result["error"] is None, "class %r, yet bf16 FC failed: %s" % (bf16_class,
                                                                          result["error"])
    assert _bf16_inner_product_impls(verbose), "no bf16 inner_product ran"
    # measured 0.0027 (Zen 4: native, and emulated under AVX512_CORE, the same value; not
    # measured on AMX): the rounding of inputs and output to bfloat16 alone; bound ~2x above
    assert result["rel_error"] < 6e-3, (
        "bf16 FullyConnected is %.4f away (relative L2) from fp32; bf16 rounding alone gives "
        "~0.3%%" % result["rel_error"])
    assert ("bfloat16 support" in isa) == (bf16_class in ("native", "amx")), (
        "class %r but oneDNN reports %s" % (bf16_class, isa))
    assert ("AMX" in isa) == (bf16_class == "amx"), "class %r but oneDNN reports %s" % (
        bf16_class, isa)


def _outer_cap():
    # an empty value is no cap (oneDNN and _run's children both treat it as unset)
    return os.environ.get("DNNL_MAX_CPU_ISA") or None


def _amx_opted_in():
    return os.environ.get(cpu.ENABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


PRELUDES = {
    "mxamp-first": "",
    # an elementwise op is MXNet's own code: oneDNN has not fixed its ISA yet
    "mxnet-first": "import mxnet as mx\n(mx.nd.ones((2, 2)) + 1).wait_to_read()\n",
    # a FullyConnected is oneDNN's: its ISA is fixed before mxamp can ask for AMX
    "onednn-op-first": "import mxnet as mx\nmx.nd.FullyConnected(mx.nd.ones((1, 4)), "
                       "mx.nd.ones((4, 4)), no_bias=True, num_hidden=4).wait_to_read()\n",
}


def _ordered_run(order_and_amx):
    order, amx_on = order_and_amx
    code = "import warnings\nwarnings.simplefilter('always')\n" + PRELUDES[order] + \
        "import mxamp\n" + BF16_FC_PROBE
    return _run(code, **{cpu.ENABLE_ENV: "" if amx_on else "0"})


@pytest.fixture(scope="module")
def ordered_runs():
    """The six children of the test below. Where AMX can be in effect, a child that imported
    MXNet first times a bfloat16 GEMM to tell, so they run one at a time; elsewhere nothing
    is timed and they start together."""
    cases = [(order, amx_on) for order in PRELUDES for amx_on in (True, False)]
    runner = map if _machine_can_use_amx() else map_side_by_side
    return dict(zip(cases, runner(_ordered_run, cases)))


@pytest.mark.cpu_class
@pytest.mark.parametrize("amx_on", [True, False], ids=["default", "MXAMP_AMX=0"])
@pytest.mark.parametrize("order", list(PRELUDES))
def test_amx_is_on_by_default_and_reported_as_it_is(order, amx_on, ordered_runs):
    """AMX is on unless MXAMP_AMX=0; where it is asked for, ``amx_in_effect`` says whether
    oneDNN really uses it (its own ISA report is the judge), and a late request warns."""
    result, verbose, stderr = ordered_runs[order, amx_on]
    features, isa = result["features"], _isa_line(verbose)
    _assert_bf16_matches_class(result, verbose)
    assert result["env_isa"] == _outer_cap(), (
        "mxamp left DNNL_MAX_CPU_ISA=%s in os.environ: child processes would inherit it without "
        "the AMX grant and die of SIGILL" % result["env_isa"])
    assert features["mxnet_imported_first"] == (order != "mxamp-first"), features
    flags = bf16_expect._flags()
    assert features["native_bf16"] == bool({"avx512_bf16", "amx_bf16"} & flags), \
        "native_bf16 must follow the CPU flags: %s" % features
    onednn_uses_amx = "AMX" in isa
    assert features["amx_in_effect"] == onednn_uses_amx, (
        "mxamp reports amx_in_effect=%s (%s) but oneDNN reports %s; on an AMX CPU this checks "
        "the assumption that a bf16 GEMM >= %.1fx float32 means AMX (mxamp/backend/amx.py)"
        % (features["amx_in_effect"], features["amx_check"], isa, amx.AMX_MIN_SPEEDUP))
    can_amx = _machine_can_use_amx() and _outer_cap() is None
    print("order %s, AMX on %s, machine can use AMX: %s; %s" % (order, amx_on, can_amx, isa))
    if not (amx_on and can_amx):
        assert not features["amx_enabled"], "AMX must stay off here: %s" % features
        assert features["reason"], "no reason given for leaving AMX off: %s" % features
        assert not onednn_uses_amx, isa
        if "amx_bf16" in flags and not _outer_cap():
            # an AMX CPU: the opt-out, else Linux refused the tiles (mxamp/backend/amx.py's text)
            want = "arch_prctl(ARCH_REQ_XCOMP_PERM) failed" if amx_on else "MXAMP_AMX=0"
            assert want in features["reason"], "the reason must say %r: %s" % (want, features)
        return
    assert features["amx_enabled"] and features["amx_granted"], features
    if order == "onednn-op-first":
        assert not onednn_uses_amx, "oneDNN fixed its ISA at the first FullyConnected: " + isa
        assert features["bf16_class"] == "native", features
        assert "not in effect" in stderr and "Import mxamp before" in stderr, stderr[-2000:]
    else:
        assert onednn_uses_amx and features["bf16_class"] == "amx", (features, isa)


@pytest.mark.cpu_class
def test_opt_out_variable_leaves_onednn_alone():
    result, verbose, _ = _run("import mxamp\n" + BF16_FC_PROBE, MXAMP_DISABLE_AMX="1")
    features = result["features"]
    assert not features["amx_enabled"] and not features["amx_granted"], features
    assert features["reason"] == "disabled by MXAMP_DISABLE_AMX=1", features
    assert "AMX" not in _isa_line(verbose), _isa_line(verbose)
    assert not any("amx" in impl for impl in _bf16_inner_product_impls(verbose))
    _assert_bf16_matches_class(result, verbose)


@pytest.mark.cpu_class
def test_unknown_opt_out_word_counts_as_set_and_warns():
    code = "import logging\nlogging.basicConfig(level=logging.WARNING)\nimport mxamp\n" \
        + BF16_FC_PROBE
    result, _, stderr = _run(code, MXAMP_DISABLE_AMX="maybe")
    assert "MXAMP_DISABLE_AMX='maybe' is not one of" in stderr, stderr[-2000:]
    assert not result["features"]["amx_enabled"], result["features"]
    assert result["features"]["reason"] == "disabled by MXAMP_DISABLE_AMX=maybe", result


@pytest.mark.cpu_class
def test_users_own_isa_cap_is_respected():
    # AVX512_CORE: the lowest cap that still has oneDNN's bf16 kernels (emulated), below VNNI/AMX
    result, verbose, _ = _run("import mxamp\n" + BF16_FC_PROBE, DNNL_MAX_CPU_ISA="AVX512_CORE")
    features = result["features"]
    assert not features["amx_enabled"], features
    assert features["onednn_max_isa"] == "AVX512_CORE", features
    assert "DNNL_MAX_CPU_ISA=AVX512_CORE" in features["reason"], features
    assert result["env_isa"] == "AVX512_CORE", "mxamp must not remove or change the user's variable"
    if "avx512bw" in bf16_expect._flags():
        assert _isa_line(verbose).endswith("AVX512BW, AVX512VL, and AVX512DQ extensions"), \
            "oneDNN did not take the user's cap: " + _isa_line(verbose)
        assert features["bf16_class"] == "emulated", features
    else:  # a cap cannot raise the ISA above the CPU's
        assert "AVX-512" not in _isa_line(verbose), _isa_line(verbose)
        assert features["bf16_class"] == "none", features
    _assert_bf16_matches_class(result, verbose)


DECIDED_CAPS = [None, "AVX2", "SSE41", "AVX512_CORE_BF16", "avx2"]


def _capped_run(cap):
    env = {"DNNL_MAX_CPU_ISA": cap} if cap else {}
    return _run("import mxamp\n" + BF16_FC_PROBE, MXAMP_DISABLE_AMX="1", **env)


@pytest.fixture(scope="module")
def capped_runs():
    """The children of the test below, started together: each reports oneDNN's verbose lines
    and the class, and times nothing (AMX is off in each)."""
    return dict(zip(DECIDED_CAPS, map_side_by_side(_capped_run, DECIDED_CAPS)))


@pytest.mark.cpu_class
@pytest.mark.parametrize("cap", DECIDED_CAPS)
def test_decided_class_is_what_onednn_does(cap, capped_runs):
    """The class mxamp decides matches oneDNN's own ISA report and the fate of a bf16 GEMM.

    ``AVX2`` is the cap CI uses to test the 'none' path on an AVX-512 machine: there it must
    make the bf16 FullyConnected fail exactly as on an AVX2 CPU. ``avx2`` (lower case) is not a
    name oneDNN knows: no cap at all."""
    result, verbose, _ = capped_runs[cap]
    _assert_bf16_matches_class(result, verbose)
    if cap in ("AVX2", "SSE41"):
        assert result["features"]["bf16_class"] == "none", result["features"]
        core = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
        if core <= bf16_expect._flags():   # the cap is what takes the kernels away: say so
            assert cap in result["features"]["bf16_reason"], result["features"]
        else:
            assert "no AVX-512 core" in result["features"]["bf16_reason"], result["features"]


@pytest.mark.cpu_class
def test_latch_fixes_onednn_isa_and_clears_the_variable():
    """The mechanism mxamp relies on, checked with an ISA every x86-64 CPU here has (AVX2):
    after `import mxnet` and a non-oneDNN op, one probe primitive makes oneDNN keep the cap,
    later primitives still use it although the variable is gone."""
    code = """
    import json, os
    import mxnet as mx
    (mx.nd.ones((2, 2)) * 3).wait_to_read()
    from mxamp.backend import cpu
    cpu._latch_onednn_isa('AVX2')
    conv = mx.nd.Convolution(mx.nd.ones((1, 16, 8, 8)), mx.nd.ones((16, 16, 3, 3)),
                             kernel=(3, 3), num_filter=16, no_bias=True)
    print('RESULT ' + json.dumps(dict(env_isa=os.environ.get('DNNL_MAX_CPU_ISA'),
                                      conv_sum=float(conv.sum().asscalar()))), flush=True)
    """
    result, verbose, _ = _run(code, MXAMP_DISABLE_AMX="1")
    assert result["env_isa"] is None, "the probe must take the variable out again: %s" % result
    assert result["conv_sum"] == 16 * 16 * 9 * 36, "all-ones 3x3x16 conv over 6x6 outputs x 16 filters"
    assert _isa_line(verbose).endswith("Intel AVX2"), _isa_line(verbose)
    conv_impls = [l.split(",")[4] for l in verbose if l.startswith("dnnl_verbose,exec,cpu,conv")]
    assert conv_impls and all("avx512" not in i for i in conv_impls), (
        "the convolution ran after the variable was removed and must still be capped at AVX2: %s"
        % conv_impls)


def test_read_cpu_flags_parses_the_flags_line(tmp_path):
    """Checks decisions only (a synthetic cpuinfo file)."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu.read_cpu_flags(str(cpuinfo)) == {"fpu", "avx512f", "amx_bf16", "amx_tile"}, \
        "only the first CPU's flags line counts"
    assert cpu.read_cpu_flags(str(tmp_path / "missing")) == frozenset(), \
        "an unreadable cpuinfo means no known flags, not an error"


@pytest.mark.cpu_class
def test_permission_request_reports_a_reason_when_refused():
    granted, detail = cpu.request_amx_permission()
    if "amx_tile" in bf16_expect._flags():
        assert granted and detail == "granted", detail
    else:
        assert not granted, "Linux granted AMX tile state on a CPU without amx_tile"
        assert "arch_prctl" in detail or "Linux x86_64" in detail, detail


# ------------------------------------------------------------ the class model, any machine
AVX2 = {"sse4_1", "avx", "avx2", "fma", "f16c"}
SKYLAKE_X = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
CASCADE_LAKE = SKYLAKE_X | {"avx512_vnni"}
COOPER_LAKE = CASCADE_LAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = COOPER_LAKE | {"amx_tile", "amx_int8", "amx_bf16"}
KNIGHTS_LANDING = AVX2 | {"avx512f", "avx512cd", "avx512er", "avx512pf"}


@pytest.mark.parametrize("flags, cap, granted, want", [
    (AVX2, None, False, "none"),                           # AMD EPYC Zen 1-3, Haswell...
    (KNIGHTS_LANDING, None, False, "none"),                # AVX-512F without the core set
    (SKYLAKE_X, None, False, "emulated"),
    (CASCADE_LAKE, None, False, "emulated"),
    (COOPER_LAKE, None, False, "native"),
    (SAPPHIRE_RAPIDS, None, True, "native"),               # oneDNN 2.4: AMX off by default
    (SAPPHIRE_RAPIDS, "AVX512_CORE_AMX", True, "amx"),
    (SAPPHIRE_RAPIDS, "ALL", True, "native"),              # "ALL" excludes AMX in oneDNN 2.4
    (SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", True, "native"),
    (SAPPHIRE_RAPIDS, "AVX512_CORE_VNNI", True, "emulated"),
    (COOPER_LAKE, "AVX512_CORE", False, "emulated"),
    (COOPER_LAKE, "AVX2", False, "none"),                  # the CI cap
    (CASCADE_LAKE, "AVX2_VNNI", False, "none"),
    (CASCADE_LAKE, "SSE41", False, "none"),
    (CASCADE_LAKE, "AVX512_MIC", False, "none"),
    (CASCADE_LAKE, "avx2", False, "emulated"),             # not a oneDNN name: no cap
    (COOPER_LAKE, "AVX512_CORE_AMX", False, "native"),     # the cap allows AMX, the CPU has none
    (AVX2, "AVX512_CORE_AMX", False, "none"),              # a cap never adds instructions
])
def test_classify_bf16_follows_onednn_rules(flags, cap, granted, want):
    """Checks decisions only (synthetic flag sets and caps passed in)."""
    got, why = cpu.classify_bf16(flags, cap, granted)
    assert got == want, "flags %s, cap %s: expected %r, got %r (%s)" % (
        sorted(flags - AVX2), cap, want, got, why)
    assert why, "every class comes with a reason"
    if cap in ("AVX2", "AVX2_VNNI", "SSE41", "AVX512_MIC") and want == "none":
        assert "DNNL_MAX_CPU_ISA=%s" % cap in why, "the reason must name the cap: %s" % why


def test_classify_bf16_without_onednn_or_off_x86():
    """Checks decisions only (a synthetic flag set, build and machine passed in)."""
    got, why = cpu.classify_bf16(SAPPHIRE_RAPIDS, onednn=False)
    assert got == "none" and "MXNET_MKLDNN_ENABLED" in why, (got, why)
    got, why = cpu.classify_bf16(SAPPHIRE_RAPIDS, machine="aarch64")
    assert got == "none" and "aarch64" in why, (got, why)
    got, why = cpu.classify_bf16(SAPPHIRE_RAPIDS, "AVX512_CORE_AMX", amx_granted=False)
    assert got == "amx" and "refused" in why, "a refused tile permission must be said: %s" % why


@pytest.mark.cpu_class
def test_class_is_decided_once_and_reported(monkeypatch):
    features = cpu.cpu_features()
    assert features.bf16_class in cpu.BF16_CLASSES and features.bf16_reason
    # a time limit: measured 0.17 ms (Zen 4; native, emulated and none alike); on AMX with
    # MXNet imported first (as here) it times a 1024-cubed GEMM, about 50-150 ms (amx.py), twice
    assert features.decided_ms < 1000, "deciding took %.1f ms" % features.decided_ms
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "SSE41")
    assert cpu.cpu_features() is features, "the class is decided once per process"
    as_dict = features.as_dict()
    assert as_dict["bf16_class"] == features.bf16_class and "cpu_model" in as_dict


@pytest.mark.cpu_class
def test_legacy_isa_variable_is_ignored_like_onednn_ignores_it():
    result, verbose, _ = _run("import mxamp\n" + BF16_FC_PROBE, MKLDNN_MAX_CPU_ISA="SSE41")
    features = result["features"]
    assert "SSE4.1" not in _isa_line(verbose), "oneDNN 2.4 must ignore MKLDNN_MAX_CPU_ISA"
    assert "MKLDNN_MAX_CPU_ISA" not in features["bf16_reason"], features
    _assert_bf16_matches_class(result, verbose)


@pytest.mark.cpu_class
def test_onednn_switch_turns_the_class_to_none():
    result, _, _ = _run("import mxamp\n" + BF16_FC_PROBE, MXNET_MKLDNN_ENABLED="0")
    features = result["features"]
    assert features["bf16_class"] == "none", features
    assert result["error"], "without oneDNN MXNet has no bf16 FullyConnected kernel"
