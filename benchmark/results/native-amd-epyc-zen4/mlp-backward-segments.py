"""How far MXNet's storage grows in the backward pass of a bfloat16 MLP, mxamp against the reference.

The throwaway script behind the README's paragraph on the MLP's 12 MB (#25): the counter's
series during one backward pass, after two steps. HOW is 'plain' (Dense with relu), 'sep'
(relu as its own operator) or 'ident' (an extra bfloat16-to-bfloat16 cast after each layer,
as the reference makes). Measured on the Zen 4, one process per number (peak MB):
    MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD=15 (MXNet's default): mxamp 44.10, reference 32.11
    =12: 40.10 / 33.96   =10: 32.10 / 34.00   =8: 35.99 / 39.98   =4: 29.98 / 27.95
    =1: 21.96 / 21.95;   'ident' at 15: mxamp 40.10, reference 32.11
    python mlp-backward-segments.py {mxamp,reference} {plain,sep,ident}
"""
import sys, json, os, tempfile
import mxnet as mx
from mxnet import gluon, autograd
from mxnet.gluon import nn
who, how = sys.argv[1], sys.argv[2]
from mxamp import dtypes; BF = dtypes.BFLOAT16
if who == 'mxamp':
    from mxamp import amp
else:
    from mxnet.contrib import amp
amp.init(target_dtype='bfloat16')
class MLP(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.fcs = [nn.Dense(2048, activation=None if how == 'sep' else 'relu') for _ in range(6)]
            for i, f in enumerate(self.fcs): self.register_child(f, 'fc%d' % i)
            self.out = nn.Dense(10)
    def hybrid_forward(self, F, x):
        for f in self.fcs:
            x = f(x)
            if how == 'sep': x = F.relu(x)
            if how == 'ident': x = F.amp_cast(x, dtype=BF)
            if how == 'ident_fc': pass
        return self.out(x)
net = MLP(); net.initialize(mx.init.Xavier()); net.hybridize()
data = mx.nd.random.uniform(shape=(512, 1024)); label = mx.nd.array([i % 10 for i in range(512)])
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
tr = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9})
amp.init_trainer(tr)
def fb():
    with autograd.record():
        loss = loss_fn(net(data), label)
        with amp.scale_loss(loss, tr) as s:
            autograd.backward(s)
for _ in range(2): fb(); tr.step(512)
mx.nd.waitall()
with autograd.record():
    loss = loss_fn(net(data), label)
mx.nd.waitall()
handle, path = tempfile.mkstemp(suffix=".json"); os.close(handle)
mx.profiler.set_config(profile_memory=True, profile_symbolic=False, profile_imperative=False, profile_api=False, filename=path)
mx.profiler.set_state("run")
with autograd.record():
    with amp.scale_loss(loss, tr) as s:
        autograd.backward(s)
mx.nd.waitall()
mx.profiler.set_state("stop"); mx.profiler.dump()
ev = json.load(open(path))["traceEvents"]
c = sorted((e for e in ev if e.get("ph") == "C" and e["name"].startswith("Memory: cpu")), key=lambda e: e["ts"])
vals = [e["args"][e["name"]] / 2**20 for e in c]
print(who, how, "bwd peak %.2f" % max(vals), ' '.join('%.0f' % v for v in vals))
