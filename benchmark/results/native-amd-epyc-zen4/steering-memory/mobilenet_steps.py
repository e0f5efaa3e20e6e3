"""MobileNet 1.0 training steps in bfloat16 with the CPU class forced to 'amx' (decisions only:
the kernels are this CPU's), steered (default) or not (NOSTEER=1); prints glibc's live blocks at
the end, and with BIGTRACE=FILE (and LD_PRELOAD=bigtrace.so) dumps the live blocks of 1 MB or more
with their call stacks. SHAPE=4x3x320x320 is the benchmark's MobileNet batch."""
import os, sys
from dataclasses import replace
sys.path.insert(0, os.path.abspath(__file__).split("/benchmark/")[0])
from mxamp.backend import cpu
cpu._CLASSIFIED = replace(cpu.cpu_features(), bf16_class="amx")
if os.environ.get("NOSTEER") == "1":
    from mxamp.runtime import hooks
    hooks._depthwise_treatment = lambda block, args: ""
import mxnet as mx
from mxnet import autograd, gluon
from mxamp import amp
amp.init("bfloat16")
net = gluon.model_zoo.vision.mobilenet1_0(classes=10)
net.initialize(mx.init.Xavier())
net.hybridize()
x = mx.nd.random.uniform(shape=tuple(int(v) for v in os.environ.get("SHAPE", "2x3x160x160").split("x"))); y = mx.nd.zeros((x.shape[0],))
tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, update_on_kvstore=False)
amp.init_trainer(tr)
L = gluon.loss.SoftmaxCrossEntropyLoss()
for i in range(int(os.environ.get("STEPS", "3"))):
    with autograd.record():
        loss = L(net(x), y)
        with amp.scale_loss(loss, tr) as s:
            autograd.backward(s)
    tr.step(x.shape[0]); mx.nd.waitall()
print("done")
import ctypes
class M(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL('libc.so.6'); libc.mallinfo2.restype = M
m = libc.mallinfo2(); print("live %.1f MB (mmapped %.1f)" % ((m.uordblks + m.hblkhd) / 2**20, m.hblkhd / 2**20))
if os.environ.get("BIGTRACE"):
    ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bigtrace.so")).bigtrace_dump(os.environ["BIGTRACE"].encode())
