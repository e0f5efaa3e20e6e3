"""The machine probe behind target_dtype='auto': decisions with injected timings on any CPU,
the cache (per machine, in a temporary cache directory: conftest.py), and the real measurement.
Only the real measurement depends on the CPU (marker ``cpu_class``); the rest checks decisions
with injected timings and a forced class."""
import os
import time
from dataclasses import replace

import pytest

import bf16_expect
from mxamp.precision.device_plan import cpu_notice, device_plan
from mxamp import amp
from mxamp.backend import cpu, probe
from mxamp.lists import get_op_lists


FAST = [("gemm", 10.0, 4.0), ("conv", 10.0, 5.0), ("bn", 2.0, 2.2)]     # Zen 5-like
SLOW = [("gemm", 10.0, 14.0), ("conv", 10.0, 12.0), ("bn", 2.0, 2.5)]   # SPR without AMX
#: SLOW's geometric mean, by hand: (10/14 * 10/12 * 2/2.5) ** (1/3) = 0.7809
SLOW_SAID = "0.78x"


@pytest.fixture
def injected(monkeypatch, tmp_path):
    """The probe with timings we choose, a private cache, and a forced 'native' class."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in ("MXAMP_REPROBE", "MXAMP_PROBE_CACHE", "MXAMP_PROBE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(probe, "_kernels_here", lambda: (True, ""))
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="native",
                                                    amx_bf16=False))
    calls = []

    def use(rows):
        def fake_measure(repeats=3, low="bfloat16"):
            calls.append(rows)
            return list(rows)
        monkeypatch.setattr(probe, "measure", fake_measure)
    probe.forget()
    yield use, calls
    probe.forget()
    amp.reset()


def test_speedup_is_the_geometric_mean_of_kernel_ratios():
    assert probe.speedup_of(FAST) == pytest.approx((2.5 * 2.0 * (2 / 2.2)) ** (1 / 3), abs=1e-3)
    assert probe.speedup_of([]) == 0.0
    assert probe.ProbeResult("k", FAST, probe.speedup_of(FAST)).bf16_pays
    assert not probe.ProbeResult("k", SLOW, probe.speedup_of(SLOW)).bf16_pays
    assert not probe.ProbeResult("k", error="no kernel").bf16_pays


@pytest.mark.parametrize("rows, want", [(FAST, "bfloat16"), (SLOW, "float32")],
                         ids=["measured-faster", "measured-slower"])
def test_auto_follows_the_measurement_not_the_class(injected, rows, want):
    use, _ = injected
    use(rows)
    plan = device_plan("auto", get_op_lists("bfloat16"), "native")
    assert plan.compute == want, plan.describe()
    if want == "float32":
        assert "measured %s float32" % SLOW_SAID in plan.reason, plan.reason
    explicit = device_plan("bfloat16", get_op_lists("bfloat16"), "native")
    assert explicit.compute == "bfloat16", "an explicit request is not second-guessed"


def test_probe_is_cached_per_machine_and_can_be_refreshed_or_bypassed(injected, monkeypatch):
    use, calls = injected
    use(FAST)
    path = os.path.join(os.environ["XDG_CACHE_HOME"], "mxamp", "probe.json")   # the fixture's
    assert probe.cache_path() == path, "the cache belongs in $XDG_CACHE_HOME/mxamp"
    first = probe.machine_probe()
    assert not first.cached and len(calls) == 1 and os.path.exists(path)
    probe.forget()
    again = probe.machine_probe()
    assert again.cached and len(calls) == 1, "a later process reads the cache"
    assert again.rows == first.rows and again.speedup == first.speedup
    monkeypatch.setenv("MXAMP_REPROBE", "1")
    assert not probe.machine_probe().cached and len(calls) == 2, "MXAMP_REPROBE=1 measures"
    monkeypatch.delenv("MXAMP_REPROBE")
    os.remove(path)
    probe.forget()
    monkeypatch.setenv("MXAMP_PROBE_CACHE", "0")
    probe.machine_probe()
    assert not os.path.exists(path), "MXAMP_PROBE_CACHE=0 writes nothing"
    # a cap other than the one this run has (CI runs these tests under several caps)
    other = "AVX2" if os.environ.get("DNNL_MAX_CPU_ISA") == "AVX512_CORE_BF16" \
        else "AVX512_CORE_BF16"
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", other)
    assert probe.machine_key() != first.key, "the ISA cap is part of the machine's key"


def test_probe_cache_may_name_its_file(injected, monkeypatch, tmp_path, caplog):
    """``MXAMP_PROBE_CACHE=/some/dir/probe.json`` is the cache file (two users of the project's
    bug hunt set it so and expected it; it counted as "on" with a warning, and the probe wrote
    to $XDG_CACHE_HOME)."""
    use, calls = injected
    use(FAST)
    mine = tmp_path / "elsewhere" / "mine.json"
    monkeypatch.setenv("MXAMP_PROBE_CACHE", str(mine))
    with caplog.at_level("WARNING", logger="mxamp"):
        first = probe.machine_probe()
    assert probe.cache_path() == str(mine) and mine.exists() and not first.cached
    assert "treating it as set" not in caplog.text, caplog.text
    default = os.path.join(os.environ["XDG_CACHE_HOME"], "mxamp", "probe.json")
    assert not os.path.exists(default), "the default file is left alone"
    probe.forget()
    assert probe.machine_probe().cached and len(calls) == 1, "read back from the named file"


def test_probe_off_leaves_auto_to_the_class(injected, monkeypatch):
    use, calls = injected
    use(SLOW)
    monkeypatch.setenv("MXAMP_PROBE", "0")
    assert device_plan("auto", get_op_lists("bfloat16"), "native").compute == "bfloat16"
    assert not calls, "MXAMP_PROBE=0 measures nothing"


def test_a_broken_measurement_means_float32(injected, monkeypatch):
    def broken(repeats=3, low="bfloat16"):
        raise RuntimeError("MXNetError: could not create a primitive descriptor iterator")
    monkeypatch.setattr(probe, "measure", broken)
    plan = device_plan("auto", get_op_lists("bfloat16"), "native")
    assert plan.compute == "float32" and "could not be measured" in plan.reason, plan.reason


def _own_conv_block_ratio(repeats=5):
    """float32 time / bfloat16 time of a 3x3 convolution + BatchNorm + ReLU, forward and
    backward, timed here with MXNet's own functions (independent of mxamp's probe)."""
    import mxnet as mx
    import numpy as np
    bf16 = np.dtype([("bfloat16", np.uint16)])

    def best(dtype):
        x = mx.nd.amp_cast(mx.nd.random.uniform(-1, 1, shape=(8, 64, 28, 28)), dtype=dtype)
        w = mx.nd.amp_cast(mx.nd.random.uniform(-.1, .1, shape=(64, 64, 3, 3)), dtype=dtype)
        stats = [mx.nd.ones((64,)) for _ in range(4)]
        x.attach_grad()
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            with mx.autograd.record():
                y = mx.nd.Convolution(x, w, kernel=(3, 3), pad=(1, 1), num_filter=64,
                                      no_bias=True)
                y = mx.nd.Activation(mx.nd.BatchNorm(y, *stats, fix_gamma=False),
                                     act_type="relu")   # as nn.Activation runs it
            y.backward()
            x.grad.wait_to_read()
            times.append(time.perf_counter() - start)
        return min(times[1:])
    return best("float32") / best(bf16)


@pytest.mark.cpu_class
def test_real_probe_on_this_cpu(monkeypatch):
    """The real measurement: on a class without bfloat16 kernels it is not run (a failed oneDNN
    primitive could poison the process); elsewhere its conv+BatchNorm+ReLU row agrees with this
    test's own timing of the same block, and its verdict too wherever that timing is clear (an
    AMD EPYC Zen 4 measured 1.26-3.01x for this block natively, 0.27-0.53x emulated, an AMX
    Xeon without AMX 0.68-0.75x per kernel: all outside the 0.9-1.3 band left open)."""
    monkeypatch.delenv("MXAMP_PROBE", raising=False)   # conftest.py turns it off elsewhere
    probe.forget()
    result = probe.machine_probe()
    if not bf16_expect.BF16_KERNELS:
        assert result.error.startswith("not run") and not result.bf16_pays, result
        assert amp.precision_plan("auto").compute == "float32"
    else:
        assert not result.error and len(result.rows) == 4 and not result.cached, result
        # the machine's verdict is the mean of the three kernels; the depthwise block only
        # decides graphs with depthwise convolutions
        kernels = [f / b for name, f, b in result.rows if not name.startswith("Depthwise")]
        mean = (kernels[0] * kernels[1] * kernels[2]) ** (1 / 3)
        assert abs(result.speedup - mean) < 2e-3, (result.speedup, mean)
        (depthwise,) = [f / b for name, f, b in result.rows if name.startswith("Depthwise")]
        assert abs(result.depthwise_speedup - depthwise) < 2e-3, result
        print("probe here: %s" % result.summary())
        own = _own_conv_block_ratio()
        (row,) = [f / b for name, f, b in result.rows if name.startswith("Convolution 3x3+Batch")]
        print("conv+BN+ReLU block: bfloat16 %.2fx float32 (this test), %.2fx (probe)" % (own, row))
        # own/row measured 0.52-1.71 over 36 runs (Zen 4, native and emulated, 2 vCPUs under
        # load 5-7 from other test runs); a factor 3 either way leaves ~1.75x margin for
        # busier machines (an inverted row, bfloat16 over float32, gives own**2: 1.6-9 here)
        assert 1 / 3 < own / row < 3, (
            "the probe timed the conv+BN+ReLU block at %.2fx float32, this test at %.2fx"
            % (row, own))
        if own > 1.3 or own < 0.9:
            assert result.bf16_pays == (own > 1.3), (
                "the probe says bfloat16 %s here (%s) but a conv+BN+ReLU block timed by this "
                "test ran %.2fx float32" % ("pays" if result.bf16_pays else "does not pay",
                                            result.summary(), own))
    start = time.perf_counter()
    rows = probe.measure(repeats=2, low="float32")
    took = time.perf_counter() - start
    assert [r[0] for r in rows] == list(probe._workloads()), rows
    assert all(f > 0 and g > 0 for _, f, g in rows), rows
    # a time limit: measured 0.31-0.79 s (Zen 4, 2 vCPUs under load 5-7; native, emulated and
    # none alike); ~6x margin for slower shared CI machines
    assert took < 5.0, "the probe's workloads took %.2f s; they must stay well under a second " \
        "on a CPU that computes bfloat16" % took
    probe.forget()


def test_explicit_bfloat16_warns_with_the_measured_ratio_where_it_lost(injected):
    use, calls = injected
    use(SLOW)
    probe.machine_probe()            # measured once (cached); the warning only reads it
    probe.forget()
    text = cpu_notice(device_plan("bfloat16", get_op_lists("bfloat16"), "native"))
    assert "measured SLOWER than float32 on this machine" in text, text
    assert SLOW_SAID in text and "amp.tune" in text, text
    assert len(calls) == 1, "the warning never measures"
