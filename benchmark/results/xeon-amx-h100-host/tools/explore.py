"""Device exploration (not part of the package): one measurement per process.

usage: explore.py CASE   (mobilenet_fp32, mobilenet_bf16, mobilenet_bf16_reshape, ...,
                          rn50inf_fp32, rn50inf_mxamp, rn50inf_mxamp_shapes, rn50inf_ref)
"""
import os, sys, time, json, collections
case = sys.argv[1]
import numpy as np
import mxnet as mx
from mxnet import gluon, autograd
sys.path.insert(0, os.getcwd())
from benchmark import workloads

def med_step(fn, warm=2, n=5):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3

def steer_bn(mode):
    """wrap sym/nd BatchNorm: reshape op (same shape) before BN, or nothing."""
    for ns in (mx.sym, mx.nd):
        orig = ns.BatchNorm
        def bn(data=None, *a, _orig=orig, _ns=ns, **k):
            if mode == "reshape":
                data = _ns.reshape(data, shape=(0, 0, 0, 0))
            return _orig(data, *a, **k)
        ns.BatchNorm = bn

def insert_after(sym, variant):
    """v2: Reshape after each BatchNorm's output; v5: after each Activation fed by a BatchNorm."""
    g = json.loads(sym.tojson(remove_amp_cast=False))
    nodes, new_entry = [], {}
    def m(e):
        return list(new_entry.get((e[0], e[1]), (None, None))) + [0] if (e[0], e[1]) in new_entry else e
    old_nodes = g["nodes"]
    for oid, n in enumerate(old_nodes):
        n = dict(n, inputs=[m(e) for e in n["inputs"]])
        nid = len(nodes); nodes.append(n)
        for k in range(8):
            new_entry[(oid, k)] = (nid, k)
        hit = (variant == "bf16_v2" and n["op"] == "BatchNorm") or (
            variant == "bf16_v5" and n["op"] == "Activation" and
            nodes[n["inputs"][0][0]]["op"] == "BatchNorm")
        if hit:
            nodes.append({"op": "Reshape", "name": n["name"] + "_lay", "attrs": {"shape": "(-2,)"},
                          "inputs": [[nid, 0, 0]]})
            new_entry[(oid, 0)] = (len(nodes) - 1, 0)
    g["nodes"] = nodes
    g["arg_nodes"] = [i for i, n in enumerate(nodes) if n["op"] == "null"]
    g["heads"] = [m(h) for h in g["heads"]]
    g.pop("node_row_ptr", None)
    return mx.sym.load_json(json.dumps(g))

def train(name, variant):
    wl = workloads.WORKLOADS[name]
    amp = None
    if variant.startswith("bf16"):
        from mxamp import amp
        amp.init(target_dtype="bfloat16")
        if "reshape" in variant:
            steer_bn("reshape")
        if variant in ("bf16_v2", "bf16_v5", "bf16_nosteer"):
            from mxamp.runtime import hooks, graph_rules
            if variant == "bf16_nosteer":
                hooks._depthwise_rule = lambda block, args: ""
            else:
                hooks._depthwise_rule = lambda block, args: graph_rules.STEER_BATCHNORM
                graph_rules.steer_batchnorm = lambda sym: insert_after(sym, variant)
    elif variant == "auto":
        from mxamp import amp
        amp.init(target_dtype="auto")
    else:
        import mxamp  # same ISA latch
    net = workloads.build_model(wl)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    data, label = workloads.make_batch(wl)
    loss_fn = workloads.make_loss(wl)
    tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    if amp:
        amp.init_trainer(tr)
    def step():
        with autograd.record():
            loss = loss_fn(net(data), label)
            if amp:
                with amp.scale_loss(loss, tr) as s:
                    autograd.backward(s)
            else:
                loss.backward()
        tr.step(data.shape[0])
        mx.nd.waitall()
    return med_step(step)

def infer(variant):
    wl = workloads.WORKLOADS["resnet50_infer"]
    net = workloads.build_model(wl); net.initialize(mx.init.Xavier()); net.hybridize()
    data, _ = workloads.make_batch(wl)
    if variant == "ref":
        from mxamp.backend import amx
        print("grant", amx.request_permission())
        os.environ["DNNL_MAX_CPU_ISA"] = "AVX512_CORE_AMX"
        net(data).wait_to_read()
        from mxnet.contrib import amp
        net = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    elif variant.startswith("mxamp"):
        from mxamp import amp
        net(data).wait_to_read()
        kw = {"example_inputs": data} if variant.endswith("shapes") else {}
        net = amp.convert_hybrid_block(net, target_dtype="bfloat16", **kw)
    else:
        import mxamp
        net(data).wait_to_read()
    return med_step(lambda: net(data).wait_to_read())

if case.startswith("rn50inf_"):
    ms = infer(case[len("rn50inf_"):])
else:
    name, variant = case.split("-", 1)
    ms = train(name, variant)
try:
    from mxamp.backend import cpu
    f = cpu.cpu_features()
    extra = dict(cls=f.bf16_class, amx=f.amx_in_effect)
except Exception as e:
    extra = dict(err=str(e))
print("RESULT", json.dumps(dict(case=case, ms=round(ms, 2), **extra)), flush=True)
