"""Keeps every test and doctest (``tests/`` and ``mxamp/``) away from the machine's state.

The probe behind ``target_dtype='auto'`` caches its measurement in the user's cache directory
and in memory. A test run must neither read what an earlier run or the user left there nor
write into it, so:

- ``XDG_CACHE_HOME`` points at a temporary directory from before the first test is collected
  (subprocesses inherit it), and at a fresh one for each test;
- ``MXAMP_PROBE=0``: 'auto' follows the documented class rule, and no test times kernels unless
  it turns the probe back on itself (``tests/test_probe.py`` does, with its own timings);
- the in-memory probe result is forgotten before and after each test.
"""
import os
import shutil
import tempfile

import pytest

_SESSION_CACHE = tempfile.mkdtemp(prefix="mxamp-test-cache-")
os.environ["XDG_CACHE_HOME"] = _SESSION_CACHE
os.environ["MXAMP_PROBE"] = "0"
os.environ.pop("MXAMP_REPROBE", None)


@pytest.fixture(autouse=True)
def _probe_isolated(tmp_path_factory, monkeypatch):
    from mxamp.backend import probe
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.setenv("MXAMP_PROBE", "0")     # restored after each test, whatever it did
    probe.forget()
    yield
    probe.forget()


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
