"""Minor page faults, system and user CPU seconds per step, and the median and fastest step, of a
workload under amp.init(bfloat16) (8 steps after 3); argv: WORKLOAD LABEL, the setting in the
environment."""
import sys, time, resource
sys.path.insert(0, '/work/main/benchmark')
import mxnet as mx
from mxnet import gluon, autograd
from mxamp import amp
import workloads
amp.init(target_dtype='bfloat16')
wl = workloads.WORKLOADS[sys.argv[1]]
net = workloads.build_model(wl); net.initialize(mx.init.Xavier()); net.hybridize()
data, label = workloads.make_batch(wl); loss_fn = workloads.make_loss(wl)
tr = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9}); amp.init_trainer(tr)
def step():
    with autograd.record():
        loss = loss_fn(net(data), label)
        with amp.scale_loss(loss, tr) as s: autograd.backward(s)
    tr.step(data.shape[0]); mx.nd.waitall()
for _ in range(3): step()
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter(); ts=[]
for _ in range(8):
    a=time.perf_counter(); step(); ts.append((time.perf_counter()-a)*1e3)
r1 = resource.getrusage(resource.RUSAGE_SELF)
ts.sort()
print(sys.argv[2], 'minflt/step %.0f' % ((r1.ru_minflt - r0.ru_minflt) / 8), 'sys s/step %.3f' % ((r1.ru_stime - r0.ru_stime)/8), 'user %.3f' % ((r1.ru_utime-r0.ru_utime)/8), 'median %.1f ms min %.1f' % (ts[4], ts[0]))
