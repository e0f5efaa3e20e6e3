"""Resident memory by mapping after the fourth backward of a training run (issue #25 notes of 2026-11-27).

    OMP_NUM_THREADS=2 python smaps-after-backward.py {fp32,o2} resnet50_train
Prints the peak (ru_maxrss), the resident size after the last backward, and its largest parts
from /proc/self/smaps (anonymous mappings of 1 MB or more hold the C heap arenas and mapped
blocks). Zen 4: fp32 1453 MB resident (1261 anonymous), O2 1239 (1042).
"""
import sys, os, resource, collections
ROOT = os.path.abspath(__file__).split('/benchmark/')[0]
sys.path.insert(0, ROOT + '/benchmark'); sys.path.insert(0, ROOT)
mode = sys.argv[1]; wlname = sys.argv[2]
import mxnet as mx
from mxnet import autograd, gluon
amp = None
if mode != 'fp32':
    from mxamp import amp
import workloads
wl = workloads.WORKLOADS[wlname]
net = workloads.build_model(wl); net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
data, label = workloads.make_batch(wl, False); loss_fn = workloads.make_loss(wl)
if mode == 'o2':
    from mxamp.conversion.o2 import cast_model
    net = cast_model(net, 'bfloat16', example_inputs=data)
tr = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9}, update_on_kvstore=False)
net.hybridize()
if amp is not None: amp.init_trainer(tr)
def smaps():
    cat = collections.Counter(); cur = None
    for line in open('/proc/self/smaps'):
        parts = line.split()
        if '-' in parts[0] and not parts[0].endswith(':'):
            path = parts[5] if len(parts) > 5 else '[anon]'
            lo, hi = [int(x, 16) for x in parts[0].split('-')]
            if path == '[anon]':
                path = '[anon >=1MB]' if hi - lo >= 2**20 else '[anon small]'
            elif path.startswith('/'):
                path = 'file:' + os.path.basename(path)
            cur = path
        elif parts[0] == 'Rss:':
            cat[cur] += int(parts[1])
    return cat
for i in range(4):
    with autograd.record():
        loss = loss_fn(net(data), label)
        if amp is not None:
            with amp.scale_loss(loss, tr) as s: autograd.backward(s)
        else: loss.backward()
    mx.nd.waitall()
    if i == 3:
        c = smaps()   # after backward: activations' gradients freed, weight gradients live
    tr.step(data.shape[0]); mx.nd.waitall()
tot = sum(c.values())
print(mode, 'peak %.0f MB; after last backward rss %.0f MB' % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, tot/1024))
for k, v in c.most_common(8): print('   %-30s %7.1f' % (k, v/1024))
