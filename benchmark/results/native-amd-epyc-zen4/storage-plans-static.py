"""MXNet's storage growth over a workload's first two training steps with
hybridize(static_alloc=True, static_shape=True), where MXNet allocates every block of a
graph's memory plan up front, so the plan's total is what the process holds.

    [NNVM_EXEC_MATCH_RANGE=16 | NNVM_EXEC_MATCH_RANGE=1 | NNVM_AUTO_SEARCH_MATCH_RANGE=1] \
        python storage-plans-static.py {mlp_train,transformer_train,resnet50_train} {fp32,mxamp,o2}
"""
import sys, json, os, tempfile, resource
sys.path.insert(0, '/work/main/benchmark'); sys.path.insert(0, '/work/main')
import mxnet as mx
from mxnet import gluon, autograd
import workloads
wlname, mode = sys.argv[1], sys.argv[2]
if mode != 'fp32':
    from mxamp import amp
    amp.init(target_dtype='bfloat16')
wl = workloads.WORKLOADS[wlname]
net = workloads.build_model(wl); net.initialize(mx.init.Xavier())
data, label = workloads.make_batch(wl)
if mode == 'o2':
    amp.cast_model(net, 'bfloat16', example_inputs=data)
net.hybridize(static_alloc=True, static_shape=True)
loss_fn = workloads.make_loss(wl)
tr = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9, **({'multi_precision': True} if mode=='o2' else {})})
if mode != 'fp32': amp.init_trainer(tr)
def step():
    with autograd.record():
        loss = loss_fn(net(data), label)
    if mode != 'fp32':
        with amp.scale_loss(loss, tr) as s: autograd.backward(s)
    else: loss.backward()
    tr.step(data.shape[0])
mx.nd.waitall()
handle, path = tempfile.mkstemp(suffix='.json'); os.close(handle)
mx.profiler.set_config(profile_memory=True, profile_symbolic=False, profile_imperative=False, profile_api=False, filename=path)
mx.profiler.set_state('run'); step(); step(); mx.nd.waitall(); mx.profiler.set_state('stop'); mx.profiler.dump()
ev = json.load(open(path))['traceEvents']; os.remove(path)
c = sorted((e for e in ev if e.get('ph') == 'C' and e['name'].startswith('Memory: cpu')), key=lambda e: e['ts'])
mb = [e['args'][e['name']] / 2**20 for e in c]
print('%s %s %s static: storage growth over 2 first steps %.1f MB, peak rss %.0f' % (wlname, mode, os.environ.get('NNVM_EXEC_MATCH_RANGE', '-') + ('/auto' if os.environ.get('NNVM_AUTO_SEARCH_MATCH_RANGE') else ''), max(mb) - mb[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024))
