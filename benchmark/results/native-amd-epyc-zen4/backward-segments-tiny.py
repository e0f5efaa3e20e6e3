import sys, time, os
import mxnet as mx
from mxnet import gluon, autograd
from mxnet.gluon import nn
n_layers, hyb = int(sys.argv[1]), sys.argv[2] == "hyb"
net = nn.HybridSequential()
for _ in range(n_layers):
    net.add(nn.Dense(16, activation="relu"))
net.initialize()
if hyb: net.hybridize()
x = mx.nd.random.uniform(shape=(8, 16))
tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
def step():
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    mx.nd.waitall()
for _ in range(20): step()
ts = []
for _ in range(200):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
ts.sort()
print("bwd=%s layers=%d %s median %.3f ms min %.3f ms" % (os.environ.get("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD", "def"), n_layers, sys.argv[2], ts[100]*1e3, ts[0]*1e3))
