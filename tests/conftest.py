"""Shared fixtures: every test that turns AMP on turns it off again, whatever happens."""
import os

# MXNet spawns one OpenMP thread per core per process; the tests are small, keep them lean.
# (Set before MXNet is imported: it reads the variable once.)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def seed():
    """Fix MXNet's and numpy's random state."""
    mx.random.seed(42)
    np.random.seed(42)
    return 42


@pytest.fixture(autouse=True)
def _amp_off_after():
    """AMP off after every test, whatever it called: ``amp.cast_model`` puts ``amp.init`` in
    force where the model computes bfloat16, and a test that forgot ``amp_off`` must not hand
    its patching to the next test."""
    yield
    from mxamp.patching import patcher as patching
    patching.reset()


@pytest.fixture
def amp_off():
    """Make sure AMP is off before and after the test."""
    from mxamp.patching import patcher as patching
    patching.reset()
    yield
    patching.reset()


@pytest.fixture
def amp_bf16(amp_off):
    """AMP on with the bfloat16 target for one test."""
    from mxamp import amp
    amp.init(target_dtype="bfloat16")
    yield amp


@pytest.fixture
def amp_fp16(amp_off):
    """AMP on with the float16 target for one test (CPU: ops without fp16 kernels stay fp32)."""
    from mxamp import amp
    amp.init(target_dtype="float16")
    yield amp


@pytest.fixture
def forced_class(monkeypatch):
    """Force this process's bfloat16 class (decisions only: nothing low-precision is run)."""
    from dataclasses import replace
    from mxamp import amp
    from mxamp.backend import cpu

    def force(name):
        monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class=name))
    yield force
    amp.reset()
