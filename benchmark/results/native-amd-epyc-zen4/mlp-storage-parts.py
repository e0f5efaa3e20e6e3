"""How MXNet's storage grows during parts of a mixed-precision MLP training step (mxamp or the reference).

The throwaway script behind the note of 2026-11-26 (#25): 101 MB (mxamp) against 89 MB (reference) in the
forward and backward, 0.05 MB in the overflow check and in the update. One process per number:
    python mlp-storage-parts.py {mxamp,reference} {fb,step,update,check}
"""
import sys
import mxnet as mx
from mxnet import gluon, autograd
ROOT = __import__('os').path.abspath(__file__).split('/benchmark/')[0]
sys.path.insert(0, ROOT + '/benchmark'); sys.path.insert(0, ROOT)
import workloads, memory_account
who, part = sys.argv[1], sys.argv[2]
if who == 'mxamp':
    from mxamp import amp
else:
    from mxnet.contrib import amp
amp.init(target_dtype='bfloat16')
wl = workloads.WORKLOADS['mlp_train']
net = workloads.build_model(wl); net.initialize(mx.init.Xavier()); net.hybridize()
data, label = workloads.make_batch(wl)
loss_fn = workloads.make_loss(wl)
tr = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9})
amp.init_trainer(tr)
def fb():
    with autograd.record():
        loss = loss_fn(net(data), label)
        with amp.scale_loss(loss, tr) as s:
            autograd.backward(s)
def step():
    fb(); tr.step(data.shape[0])
step(); mx.nd.waitall()
grads = [p.grad() for p in net.collect_params().values()]
if part == 'fb':
    print(who, part, memory_account.step_storage_mb(fb))
elif part == 'step':
    print(who, part, memory_account.step_storage_mb(step))
elif part == 'check':
    from mxamp.training import overflow
    print(who, part, memory_account.step_storage_mb(lambda: overflow.check_finite(grads)))
elif part == 'update':
    fb(); mx.nd.waitall()
    print(who, part, memory_account.step_storage_mb(lambda: tr.step(data.shape[0])))
