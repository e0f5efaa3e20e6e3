"""amp.tune's trials, each timed in a forked copy of the process (``backend/forked.py``): what a
trial allocates ends with its copy, a trial that dies is a failed row (float32 dying is an
error), an error in a trial arrives as itself or, where it does not pickle, as text, and a copy
writes no core file. A numpy-semantics model is tuned too. Decisions use injected timings where
a test says so (split from ``test_tune.py``, whose helpers these tests share).
"""
import io
import json
import os
import subprocess
import sys

import mxnet as mx
import pytest

from mxamp import amp, tuning as tune_mod
from side_by_side import map_side_by_side
from test_tune import _mobile_like, example_batch
from test_tune import native_with  # noqa: F401 (a fixture: class native, injected timings)

_TRIALS_MEMORY = """
import json, os, resource, sys
import mxnet as mx
from mxamp import amp

class Elementwise(mx.gluon.HybridBlock):
    # four scaled ReLUs on a 32 MB input: each keeps two 32 MB arrays for backward
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scale = self.params.get("scale", shape=(1,), init=mx.init.One())

    def hybrid_forward(self, F, x, scale):
        for _ in range(4):
            x = F.relu(F.broadcast_mul(x, scale))
        return x

net = Elementwise()
net.initialize()
net.hybridize()
x = mx.nd.ones((8 * 2 ** 20,))
mx.nd.waitall()
def peak():
    # this process's own high-water mark: ru_maxrss would start at the peak of the process
    # that started this one (Linux keeps it across exec), the test runner's
    with open("/proc/self/status") as f:
        return [int(l.split()[1]) for l in f if l.startswith("VmHWM:")][0] / 1024.0
before = peak()
policy = amp.tune(net, x, loss_fn=lambda y: y.sum(), steps=1, report=None)
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
print("RESULT " + json.dumps([peak() - before, children - before, policy.name]))
"""


def _trials_memory(forked):
    env = dict(os.environ, MXAMP_TUNE_FORK="1" if forked else "0")
    proc = subprocess.run([sys.executable, "-c", _TRIALS_MEMORY], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][0][7:])


@pytest.fixture(scope="module")
def trials_memory():
    """Both tuning processes of the test below, started together: it counts memory, and which
    policy wins (the timing that load could sway) does not change what the trials allocate."""
    return dict(zip((True, False), map_side_by_side(_trials_memory, (True, False))))


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "in_process"])
def test_trials_leave_their_memory_in_their_own_process(forked, trials_memory):
    """Counted, not timed: a model whose float32 training pass keeps four 32 MB ReLU outputs
    for backward. Trials in a forked copy leave the tuning process's peak where it was; in the
    process (MXAMP_TUNE_FORK=0) the same trials raise it by their activations. Measured on the
    Zen 4 (2026-11-26), tuning process / trials' copy: forked +0.3 / +300 MB (class native,
    bfloat16 candidates timed too), +1.3 / +137 MB (capped to AVX2: float32 alone); in the
    process +290 and +232 MB."""
    grew, child_grew, _ = trials_memory[forked]
    if forked:
        assert grew < 30, "the tuning process grew by %.0f MB while trials ran elsewhere" % grew
        assert child_grew > 100, "the trials' copy grew by only %.0f MB" % child_grew
    else:
        assert grew > 100, "trials in the process grew it by only %.0f MB" % grew


def test_a_trial_that_dies_is_a_failed_row_and_float32_dying_is_an_error(native_with,
                                                                         monkeypatch):
    """Checks decisions only (forced class native). A candidate whose process dies (here a
    SIGKILL as its first call starts, as a kernel crash would end it) is reported and never
    chosen, and the user's process lives on; float32 dying is raised, naming it."""
    import signal
    monkeypatch.delenv("MXAMP_TUNE_FORK")   # the fixture's in-process switch, undone here
    fp32, bf16 = amp.Policy("float32", "float32"), amp.Policy("bfloat16", "bfloat16")

    parent = os.getpid()

    def tune_killed_under(policy_name):
        net = _mobile_like()
        net.register_forward_pre_hook(   # in a trial's process, before anything computes
            lambda block, inputs: os.kill(os.getpid(), signal.SIGKILL)
            if os.getpid() != parent and amp.is_initialized() == (policy_name != "float32")
            else None)
        report = io.StringIO()
        policy = amp.tune(net, example_batch(), candidates_=[fp32, bf16], steps=1, report=report)
        return policy, report.getvalue()
    policy, report = tune_killed_under("bfloat16")
    rows = {r["name"]: r for r in policy.table}
    assert policy.name == "float32" and "killed by SIGKILL" in rows["bfloat16"]["error"], rows
    assert "failed: the forked process ended" in report, report
    with pytest.raises(tune_mod.ForkedCallDied, match="while timing float32, .*SIGKILL"):
        tune_killed_under("float32")
    assert not amp.is_initialized()


def test_an_error_in_a_trial_is_raised_as_itself(monkeypatch):
    """A wrong loss function raises its own exception in the user's process, as it would without
    the fork, with the trial's traceback attached."""
    monkeypatch.delenv("MXAMP_TUNE_FORK", raising=False)   # the default: forked trials
    def wrong(out):
        raise ValueError("this loss needs a label")
    with pytest.raises(ValueError, match="this loss needs a label") as caught:
        amp.tune(_mobile_like(), example_batch(), loss_fn=wrong, steps=1, report=None)
    if tune_mod.FORK_AVAILABLE:
        assert "forked process" in "".join(getattr(caught.value, "__notes__", []))
    assert not amp.is_initialized()


def test_a_numpy_semantics_model_is_tuned():
    """A model written for ``npx.set_np()`` takes numpy arrays and builds numpy symbols: tune
    read its graph with legacy symbols and failed ("This is a numpy operator which can only
    accept MXNet numpy ndarrays"). Runs on every class: the candidates come from the graph,
    and the trials (float32 alone on class 'none') run the model as its user does."""
    mx.npx.set_np()
    try:
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Conv2D(8, 3, in_channels=3), mx.gluon.nn.BatchNorm(),
                mx.gluon.nn.Dense(10))
        net.initialize()
        net.hybridize()
        x = mx.np.random.uniform(size=(4, 3, 16, 16))
        names = [p.name for p in tune_mod.candidates(net, x, "bfloat16")]
        policy = amp.tune(net, x, loss_fn=lambda out: out.sum(), steps=1, report=None,
                          apply=False)
    finally:
        mx.npx.reset_np()
    assert names == ["float32", "bfloat16", "bfloat16, stem in float32",
                     "bfloat16, BatchNorm in float32"], names
    assert policy.table[0]["name"] == "float32" and all(r["ms"] > 0 for r in policy.table)


class _TwoArgumentError(Exception):
    """An exception pickle cannot rebuild (its __init__ takes two arguments, args holds one)."""

    def __init__(self, first, second):
        super().__init__("%s and %s" % (first, second))


@pytest.mark.skipif(not tune_mod.FORK_AVAILABLE, reason="no os.fork here")
def test_an_error_that_does_not_pickle_arrives_as_text():
    from mxamp.backend.forked import call_in_fork

    def fails():
        raise _TwoArgumentError("left", "right")
    with pytest.raises(RuntimeError, match="_TwoArgumentError: left and right"):
        call_in_fork(fails)
    assert call_in_fork(lambda: (1, [2.0])) == (1, [2.0])


@pytest.mark.skipif(not tune_mod.FORK_AVAILABLE, reason="no os.fork here")
def test_a_forked_copy_writes_no_core_file_and_the_process_keeps_its_limit():
    """A trial or probe that crashes must not make the system dump the whole copy first."""
    import resource
    from mxamp.backend.forked import call_in_fork
    before = resource.getrlimit(resource.RLIMIT_CORE)
    assert call_in_fork(lambda: resource.getrlimit(resource.RLIMIT_CORE)) == (0, 0)
    assert resource.getrlimit(resource.RLIMIT_CORE) == before, "the parent's limit changed"
