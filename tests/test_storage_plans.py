"""MXNet's memory planner under mxamp, by counting: ``import mxamp`` has MXNet keep the graph
memory plan, of match ranges 1 to 16, that allocates least (``NNVM_AUTO_SEARCH_MATCH_RANGE=1``,
``mxamp/backend/graph_memory.py``), unless the user chose.

The expectations come from MXNet's own storage counter (its profiler's ``Memory: cpu/0``), in
child processes that import MXNet first, as scripts do: how far one training step (forward
and backward) grows MXNet's storage with mxamp's choice, against the same model with MXNet's
default range of 16 chosen by the user. Counts, not times.
"""
import json
import os
import subprocess
import sys

import pytest

from bf16_expect import BF16_KERNELS, where
from side_by_side import map_side_by_side
from storage_counter import GROWTH_SOURCE

_MATCH_RANGE = "NNVM_EXEC_MATCH_RANGE"
_PLAN_SEARCH = "NNVM_AUTO_SEARCH_MATCH_RANGE"
_USERS_CHOICE = "16"   # MXNet's own default, chosen explicitly

_CHILD = """
import json, os
import mxnet as mx            # first, as scripts do
from mxamp import amp
from mxnet import autograd
from mxnet.gluon import nn
amp.init(target_dtype='bfloat16')
net = nn.HybridSequential()
for _ in range(4):
    net.add(nn.Dense(1024, activation='relu'))
net.initialize(mx.init.Xavier())
net.hybridize()
data = mx.nd.random.uniform(shape=(256, 1024))

def step():
    with autograd.record():
        out = net(data).sum()
    out.backward()

for _ in range(2):
    step()
growth = storage_growth_mb(step)
print(json.dumps({'growth_mb': growth,
                  'variables': {k: v for k, v in os.environ.items() if k.startswith('NNVM_')}}))
"""


def _step_growth(users):
    """One child's step growth; ``users``: the match range the user set, or None."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NNVM_")}
    if users is not None:
        environ[_MATCH_RANGE] = users
    proc = subprocess.run([sys.executable, "-c", GROWTH_SOURCE + _CHILD], env=environ,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.cpu_class
def test_mxnet_keeps_the_graph_memory_plan_that_allocates_least_unless_the_user_chose():
    """Four Dense(1024) layers, batch 256, under ``amp.init('bfloat16')``, hybridized, MXNet
    imported first. Where bfloat16 computes, the graph mixes bfloat16 weight gradients (2 MB)
    with activations and their gradients (0.5 MB), and with MXNet's range of 16 the small arrays
    hold blocks the large ones grew. Measured on the Zen 4, growth of MXNet's storage in one
    step (MB), mxamp against the user's 16: 13.00 against 16.00 in bfloat16 (native and
    emulated), 6.0 against 6.0 in float32 (AVX2 cap), twice each. The bound asks for the
    measured gap of 3.0 MB less a tenth. Where bfloat16 does not compute (class ``none``) the
    graph is float32, whose arrays here come in sizes every range treats alike: the growth is
    the user's, within 0.05 MB (the counter gave the same bytes twice)."""
    mxamp_choice, users = map_side_by_side(_step_growth, [None, _USERS_CHOICE])
    assert mxamp_choice["variables"] == {_PLAN_SEARCH: "1"}, (
        "import mxamp set %s" % mxamp_choice["variables"])
    assert users["variables"] == {_MATCH_RANGE: _USERS_CHOICE}, (
        "with the user's %s=%s, import mxamp left %s" % (_MATCH_RANGE, _USERS_CHOICE,
                                                         users["variables"]))
    said = "a step grew MXNet's storage by %.3f MB under mxamp's choice and by %.3f MB with " \
           "the user's %s=%s %s" % (mxamp_choice["growth_mb"], users["growth_mb"],
                                    _MATCH_RANGE, _USERS_CHOICE, where())
    if BF16_KERNELS:
        assert mxamp_choice["growth_mb"] <= users["growth_mb"] - 2.7, said
    else:
        assert abs(mxamp_choice["growth_mb"] - users["growth_mb"]) <= 0.05, said
