"""Resident size, live C-heap blocks (glibc mallinfo2) and step times, phase by phase, of one training process.

The throwaway script behind the #25 notes of 2026-11-26 on where O2's last megabytes go. One
process per line:
    OMP_NUM_THREADS=2 python heap-phases.py {fp32,reference,mxamp,o2} [WORKLOAD]
WORKLOAD is a benchmark/workloads.py name (default mlp_train). A thread samples the live blocks
every 2 ms and prints their peak and the resident size then ("livepeak", "rss-then").
Variants through the environment: TRIM=1 (malloc_trim after cast_model), EAGER=1 (O2's masters
and optimizer state before the first step), STATIC=1 (hybridize(static_alloc=True)); glibc's
MALLOC_ARENA_MAX / MALLOC_MMAP_THRESHOLD_ and MXNet's MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD
work as usual. Measured on the Zen 4 (see README, Memory): after a step, MLP O2 live blocks
342 MB (294.6 used + 47.1 mapped) against float32's 357; ResNet-50 live peak O2 1280 MB
against float32's 2232, resident 1425 and 2121 then. With MT_SO set, the phases are marked in
the big-allocation log of onednn-scratch/ (see onednn-scratch-8869271.md).
"""
import sys, os, resource, ctypes
ROOT = os.path.abspath(__file__).split('/benchmark/')[0]
sys.path.insert(0, ROOT + '/benchmark'); sys.path.insert(0, ROOT)
mode = sys.argv[1]; wlname = sys.argv[2] if len(sys.argv) > 2 else 'mlp_train'
def rss():
    with open('/proc/self/statm') as f: return int(f.read().split()[1]) * 4096 / 2**20
class M(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL('libc.so.6')
# MT_SO=path/to/big_alloc_logger.so (also in LD_PRELOAD): mark the phases in its log
MARK = ctypes.CDLL(os.environ['MT_SO']).mt_mark if os.environ.get('MT_SO') else None
libc.mallinfo2.restype = M
def show(tag):
    import mxnet as mx; mx.nd.waitall()
    if MARK: MARK(tag.encode())   # a phase mark in onednn-scratch/big_alloc_logger.c's log
    m = libc.mallinfo2()
    print("%-14s rss %7.1f peak %7.1f  malloc-used %7.1f free-held %7.1f mmapped %7.1f" % (tag, rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, m.uordblks/2**20, m.fordblks/2**20, m.hblkhd/2**20), flush=True)
import threading
PEAK=[0.0,0.0]
def sampler():
    import time
    while True:
        m = libc.mallinfo2(); live=(m.uordblks+m.hblkhd)/2**20
        if live>PEAK[0]: PEAK[0]=live; PEAK[1]=rss()
        time.sleep(0.002)
threading.Thread(target=sampler, daemon=True).start()
import mxnet as mx
from mxnet import autograd, gluon
show('import mx')
import workloads
amp = None
if mode != 'fp32':
    if mode == 'reference':
        from mxnet.contrib import amp
    else:
        from mxamp import amp
    if mode != 'o2': amp.init(target_dtype='bfloat16')
show('amp')
wl = workloads.WORKLOADS[wlname]
net = workloads.build_model(wl); net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
data, label = workloads.make_batch(wl, False); loss_fn = workloads.make_loss(wl)
show('built')
if mode == 'o2':
    from mxamp.conversion.o2 import cast_model
    net = cast_model(net, 'bfloat16', example_inputs=data)
    if os.environ.get('TRIM'):
        mx.nd.waitall(); from mxamp.backend.heap import release_free_memory; release_free_memory()
    show('cast')
tr = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.9}, update_on_kvstore=False)
net.hybridize(static_alloc=bool(os.environ.get("STATIC")))
if amp is not None: amp.init_trainer(tr)
if os.environ.get('EAGER') and mode == 'o2':   # masters and state before the first step
    up = tr._updaters[0]
    for i, p in enumerate(tr._params):
        up._master_state(i, p.data())
show('trainer')
import time
for i in range(int(os.environ.get('STEPS', 5))):
    t0=time.perf_counter()
    with autograd.record():
        loss = loss_fn(net(data), label)
        if amp is not None:
            with amp.scale_loss(loss, tr) as s: autograd.backward(s)
        else: loss.backward()
    show('fb%d' % i)
    tr.step(data.shape[0]); show('step%d' % i); print('livepeak %.1f rss-then %.1f' % tuple(PEAK)); print('time', i, round((time.perf_counter()-t0)*1e3))
