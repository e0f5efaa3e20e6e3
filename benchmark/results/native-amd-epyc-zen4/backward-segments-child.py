import json, os, sys, tempfile
import mxnet as mx            # first, as scripts do
from mxamp import amp
from mxnet import autograd, gluon
from mxnet.gluon import nn
how = sys.argv[1]             # 'hybridized', 'hybridized15' (the user's 15) or 'imperative'
amp.init(target_dtype='bfloat16')
mx.random.seed(0)
net = nn.HybridSequential()
for _ in range(6):
    net.add(nn.Dense(1024, activation='relu'))
net.add(nn.Dense(10))
net.initialize(mx.init.Xavier())
if how == 'hybridized':
    net.hybridize()
elif how == 'hybridized15':
    net.hybridize(backward_bulk_size=15)
data = mx.nd.random.uniform(shape=(256, 512))
label = mx.nd.array([i % 10 for i in range(256)])
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9})
amp.init_trainer(trainer)
def backward(loss):
    with amp.scale_loss(loss, trainer) as scaled:
        autograd.backward(scaled)
for _ in range(2):
    with autograd.record():
        loss = loss_fn(net(data), label)
        backward(loss)
    trainer.step(256)
with autograd.record():
    loss = loss_fn(net(data), label)
mx.nd.waitall()
handle, path = tempfile.mkstemp(suffix='.json')
os.close(handle)
mx.profiler.set_config(profile_memory=True, profile_symbolic=False, profile_imperative=False,
                       profile_api=False, filename=path)
mx.profiler.set_state('run')
with autograd.record():
    backward(loss)
mx.nd.waitall()
mx.profiler.set_state('stop')
mx.profiler.dump()
with open(path) as f:
    events = json.load(f)['traceEvents']
os.remove(path)
counter = sorted((e for e in events if e.get('ph') == 'C' and e['name'].startswith('Memory: cpu')),
                 key=lambda e: e['ts'])
mb = [e['args'][e['name']] / 2 ** 20 for e in counter]
print(json.dumps({'growth_mb': round(max(mb) - mb[0], 2) if mb else None,
                  'flags': [list(f) for f in net._flags] if how != 'imperative' else None,
                  'variable': os.environ.get('MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD')}))
