"""Which operator of a bfloat16 MLP's training step grows MXNet's storage, and by how much.

    MXNET_EXEC_BULK_EXEC_TRAIN=0 [NNVM_EXEC_MATCH_RANGE=16] python storage-plans-trace.py {amp,fp32} 0 512

Four Dense(2048, relu) layers, batch 512 (argument 3), hybridized with backward_bulk_size
(argument 2), one profiled forward and backward after a warm-up; prints the operators in order
with the storage counter's value (MB above the step's start) after each change.
"""
import sys, json, os
import mxnet as mx, mxamp
from mxamp import amp
from mxnet import gluon, autograd
if sys.argv[1] == 'amp': amp.init('bfloat16')
net = gluon.nn.HybridSequential()
for i in range(4): net.add(gluon.nn.Dense(2048, in_units=2048, activation='relu'))
net.initialize(); net.hybridize(backward_bulk_size=int(sys.argv[2]))
x = mx.nd.random.uniform(shape=(int(sys.argv[3]), 2048))
def fb():
    with autograd.record():
        y = net(x).sum()
    y.backward()
fb(); mx.nd.waitall()
path = '/tmp/storage-plans-trace.json'
mx.profiler.set_config(profile_memory=True, profile_symbolic=True, profile_imperative=True, filename=path)
mx.profiler.set_state('run'); fb(); mx.nd.waitall(); mx.profiler.set_state('stop'); mx.profiler.dump()
ev=json.load(open(path))['traceEvents']
ev=[e for e in ev if 'ts' in e and e.get('ph') in ('C','B','X')]
ev.sort(key=lambda e:e['ts'])
base=None; out=[]
for e in ev:
    if e.get('ph')=='C' and e['name'].startswith('Memory'):
        v=e['args'][e['name']]/2**20
        if base is None: base=v
        out.append('%.0f'%(v-base))
    elif e['name']!='DeleteVariable' and not e['name'].startswith('MXNet C'):
        out.append(e['name'][:18])
print(' '.join(out))
