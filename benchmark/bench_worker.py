"""Times ONE (workload, mode) pair in this process and prints one ``RESULT {json}`` line.

``run_all.py`` starts one fresh process per measurement, because AMP patching and oneDNN's ISA
choice are process-wide and cannot be undone. Modes:

- ``fp32``: the unchanged model.
- ``fp32_mxamp_imported``: the same after ``import mxamp`` (no ``amp.init``): the MXNet
  settings mxamp makes at import (``mxamp.doctor`` lists them: graph memory plans, the C
  heap, ...) hold for float32 work too, so this is the float32 that a float32-compute mode of
  mxamp is held against (issue #25: within 2%).
- ``reference``: ``mxnet.contrib.amp`` (bf16); mxamp is never imported, so no AMX.
- ``reference_amx``: the same, after granting AMX by hand (arch_prctl + DNNL_MAX_CPU_ISA): what
  the reference could reach on this CPU. Skipped where the CPU/kernel has no AMX.
- ``mxamp``: the drop-in path, ``from mxamp import amp``; ``amp.init(target_dtype='bfloat16')``,
  ``amp.init_trainer``, ``amp.scale_loss``; nothing else.
- ``mxamp_auto``: the same with ``target_dtype='auto'``: bfloat16 where the CPU computes it
  natively, float32 compute (AMP, loss scaler and skipping still on) elsewhere.
- ``mxamp_tuned``: ``amp.tune`` on the model and batch (training: forward+backward; inference:
  forward) picks the fastest policy not slower than float32 and applies it; the chosen policy
  and the tuning time are reported; with ``--policy PATH`` the policy is saved there.
- ``mxamp_as_tuned``: no tuning: the policy a ``mxamp_tuned`` process saved (``--policy PATH``)
  put in force where tuning would have put it (``amp.init(policy=...)``, or
  ``convert_hybrid_block`` with its arguments). Side by side with that process, it shows what
  tuning itself left in memory (issue #25: at most 5% above this run).
- ``mxamp_o2``: mxamp's O2 mode as documented: ``amp.init`` (routes ops that ``hybrid_forward``
  calls directly, e.g. ``F.batch_dot``, to float32) + ``amp.cast_model`` (bf16 parameters, fp32
  master weights in the trainer).

Training modes time forward+backward+``trainer.step`` with a full sync per step; inference
modes time the forward of the ``convert_hybrid_block`` result (fp32: the hybridized model).

    python benchmark/bench_worker.py mlp_train mxamp --steps 10 --warmup 3
"""
import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # the repo root, for `import mxamp`

import memory_account  # noqa: E402
from workloads import INIT_TARGETS, WORKLOADS, build_model, make_batch, make_loss  # noqa: E402

MODES = ("fp32", "fp32_mxamp_imported", "reference", "reference_amx", "mxamp", "mxamp_auto",
         "mxamp_tuned", "mxamp_as_tuned", "mxamp_o2")
#: Modes whose AMP is put in force after the model is built, by a policy.
POLICY_MODES = ("mxamp_tuned", "mxamp_as_tuned")
TARGET = "bfloat16"
#: The target_dtype each mode asks AMP for.
TARGETS = {"mxamp_auto": "auto"}


def target_of(mode):
    return TARGETS.get(mode, TARGET)


class Skip(Exception):
    """The mode does not apply on this machine/build (reported as n/a, not as an error)."""


def grant_amx_by_hand():
    """The 'reference + AMX' prelude: must run before MXNet's first oneDNN primitive."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/cpuinfo") as f:
        if "amx_bf16" not in f.read():
            raise Skip("CPU has no amx_bf16")
    if libc.syscall(158, 0x1023, 18) != 0:
        raise Skip("Linux refused the AMX tile state (errno %d)" % ctypes.get_errno())
    os.environ["DNNL_MAX_CPU_ISA"] = "AVX512_CORE_AMX"


def amp_module(mode):
    """The AMP module a user of ``mode`` imports (None for fp32)."""
    if mode in ("reference", "reference_amx"):
        from mxnet.contrib import amp
        return amp
    if mode.startswith("mxamp"):
        from mxamp import amp
        return amp
    return None


def o2_cast(net, data):
    """mxamp's O2 cast of the whole model (bf16 parameters, fp32 master weights in the trainer)."""
    try:
        from mxamp.conversion.o2 import cast_model
    except ImportError as err:
        raise Skip("mxamp.conversion.o2 not available: %s" % err)
    return cast_model(net, TARGET, example_inputs=data)


def _yolo_batch(workload, quick):
    """GluonCV's YOLOv3 model and one batch of generated VOC-style images with the targets its
    training transform makes (the loop of example/gluoncv_yolo3.py)."""
    try:
        import gluoncv  # noqa: F401
    except ImportError as err:
        raise Skip("gluoncv is not installed (pip install -e '.[gluoncv]'): %s" % err)
    import mxnet as mx
    from gluoncv import model_zoo
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "example"))
    from gluoncv_yolo3 import get_dataloader
    from synthetic_detection import SyntheticVOC
    shape = workload.quick_shape if quick else workload.data_shape
    net = model_zoo.get_model(workload.model, pretrained=False, pretrained_base=False)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.initialize()
    loader = get_dataloader(net, SyntheticVOC(num_images=shape[0], size=shape[2], seed=0),
                            shape[2], shape[0])
    batch = [b.as_in_context(mx.cpu()) for b in next(iter(loader))]  # off cpu_shared
    return net, batch[0], [batch[6]] + [batch[i] for i in range(1, 6)]


def build_yolo_train_step(workload, mode, quick):
    """YOLOv3's training step: the network returns its four losses given the targets."""
    import mxnet as mx
    from mxnet import autograd, gluon
    amp = amp_module(mode)
    if amp is not None and mode not in POLICY_MODES:
        amp.init(target_dtype=target_of(mode))
    net, data, targets = _yolo_batch(workload, quick)
    if mode == "mxamp_o2":
        net = o2_cast(net, data)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.001,
                            "momentum": 0.9, "wd": 0.0005}, update_on_kvstore=False)
    net.hybridize()

    def total(outs):
        return sum(outs[:4])
    if mode in POLICY_MODES:
        TUNED.update(_tune(amp, net, (data,) + tuple(targets), total, train=True, mode=mode))
    if amp is not None:
        amp.init_trainer(trainer)

    def step():
        with autograd.record():
            loss = total(net(data, *targets))
            if amp is not None:
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            else:
                loss.backward()
        trainer.step(data.shape[0])
        mx.nd.waitall()
        return float(loss.astype("float32").mean().asscalar())
    step.net, step.trainer = net, trainer   # for the memory account
    return step


def build_train_step(workload, mode, quick):
    """Builds model, trainer and AMP for ``mode``; returns a function running one synced step."""
    import mxnet as mx
    from mxnet import autograd, gluon
    if workload.model.startswith("yolo3"):
        return build_yolo_train_step(workload, mode, quick)
    amp = amp_module(mode)
    if amp is not None and mode not in POLICY_MODES:
        amp.init(target_dtype=target_of(mode))  # before the model is built, as users do
    net = build_model(workload)
    net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
    data, label = make_batch(workload, quick)
    loss_fn = make_loss(workload)
    optimizer_args = {"learning_rate": 0.01, "momentum": 0.9}
    if mode == "mxamp_o2":
        net = o2_cast(net, data)
    trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer_args, update_on_kvstore=False)
    net.hybridize()
    if mode in POLICY_MODES:
        TUNED.update(_tune(amp, net, data, lambda out: loss_fn(out, label), train=True,
                           mode=mode))
    if amp is not None:
        amp.init_trainer(trainer)
    batch_size = data.shape[0]

    def step():
        with autograd.record():
            loss = loss_fn(net(data), label)
            if amp is not None:
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            else:
                loss.backward()
        trainer.step(batch_size)
        mx.nd.waitall()
        return float(loss.mean().astype("float32").asscalar())
    step.net, step.trainer = net, trainer   # for the memory account
    return step


def build_infer_step(workload, mode, quick):
    """fp32: the hybridized model; AMP modes: ``amp.convert_hybrid_block`` of it."""
    import mxnet as mx
    net = build_model(workload)
    net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
    net.hybridize()
    data, _ = make_batch(workload, quick)
    net(data).wait_to_read()                   # conversion needs a graph that already ran
    amp = amp_module(mode)
    if mode == "mxamp_o2":
        raise Skip("O2 is a training mode")
    if mode in POLICY_MODES:
        TUNED.update(_tune(amp, net, data, None, train=False, mode=mode, apply=False))
        policy = TUNED.pop("_policy")
        if policy.target != "float32":
            net = amp.convert_hybrid_block(net, ctx=mx.cpu(), **policy.convert_kwargs())
    elif amp is not None:
        net = amp.convert_hybrid_block(net, target_dtype=target_of(mode), ctx=mx.cpu())

    def step():
        out = net(data)
        out.wait_to_read()
        return float(out.astype("float32").mean().asscalar())
    step.net, step.trainer = net, None   # for the memory account
    return step


#: What the tuned mode chose, for the RESULT line.
TUNED = {}


#: ``--policy``: where ``mxamp_tuned`` saves its policy and ``mxamp_as_tuned`` reads it.
POLICY_FILE = []


def _tune(amp, net, data, loss_fn, train, mode, apply=True):
    """``mxamp_tuned``: ``amp.tune`` (the policy saved where ``--policy`` says);
    ``mxamp_as_tuned``: the saved policy, put in force as ``amp.tune`` would have."""
    start = time.perf_counter()
    if mode == "mxamp_as_tuned":
        if not POLICY_FILE or not os.path.exists(POLICY_FILE[0]):
            raise Skip("mxamp_as_tuned needs --policy, the file a mxamp_tuned run saved")
        policy = amp.Policy.load(POLICY_FILE[0])
        if apply and policy.target != "float32":
            amp.init(policy=policy)
    else:
        policy = amp.tune(net, data, loss_fn=loss_fn, train=train, report=sys.stderr,
                          apply=apply)
        if POLICY_FILE:
            policy.save(POLICY_FILE[0])
    return {"policy": policy.name, "tune_ms": (time.perf_counter() - start) * 1e3,
            "_policy": policy}


def time_amp_init(mode, target):
    """``(seconds of importing the AMP module after mxnet, seconds of the first
    amp.init(target_dtype=target))`` in this process: mxamp computes at import what its init
    needs, so both are reported."""
    import mxnet  # noqa: F401  (already imported by a user before AMP)
    start = time.perf_counter()
    amp = amp_module(mode)
    imported = time.perf_counter()
    if amp is None:
        raise Skip("fp32 has no amp.init")
    amp.init(target_dtype=target)
    return imported - start, time.perf_counter() - imported


def measure(workload_name, mode, quick, steps, warmup):
    """Runs the measurement; returns the RESULT dict (times in milliseconds)."""
    result = {"workload": workload_name, "mode": mode, "quick": quick}
    if mode == "fp32_mxamp_imported":
        import mxamp  # noqa: F401  (its import-time settings, nothing else)
    if mode == "reference_amx":
        grant_amx_by_hand()
    if mode.startswith("mxamp") and workload_name not in INIT_TARGETS:  # those time the import
        import mxamp.backend.cpu
        result["cpu_features"] = mxamp.backend.cpu.cpu_features().as_dict()
    if workload_name in INIT_TARGETS:
        import_s, init_s = time_amp_init(mode, INIT_TARGETS[workload_name])
        times, last = [init_s * 1e3], None
        result["import_ms"] = import_s * 1e3
    else:
        workload = WORKLOADS[workload_name]
        build = build_train_step if workload.kind == "train" else build_infer_step
        step = build(workload, mode, quick)
        result["baseline_mb"] = memory_account.peak_mb(sync=True)
        step()   # the first, untimed, step makes the optimizer state and mxamp's workspace
        before = memory_account.account(step.net, step.trainer)
        # the second step, profiled: every counted array already exists, so what MXNet's
        # storage grows by is the step's own (activations, casts, temporaries) at its peak
        second_mb = memory_account.step_storage_mb(step)
        after = memory_account.account(step.net, step.trainer)
        result.update(after, step_storage_mb=second_mb,
                      weight_casts_mb=memory_account.weight_casts_mb(step.net))
        if second_mb is not None:
            result["graph_mb"] = second_mb - (memory_account.counted_mb(after)
                                              - memory_account.counted_mb(before))
        for _ in range(max(warmup - 2, 0)):
            step()
        times, cpu_times = [], []
        for _ in range(steps):
            start, cpu_start = time.perf_counter(), time.process_time()
            last = step()
            times.append((time.perf_counter() - start) * 1e3)
            cpu_times.append((time.process_time() - cpu_start) * 1e3)
        # CPU time of all the process's threads: less sensitive to a shared machine's load
        # than wall time (with OMP_NUM_THREADS=1; OpenMP threads spin while they wait).
        result["median_cpu_ms"] = statistics.median(cpu_times)
    if mode.startswith("mxamp") and "cpu_features" not in result:  # after timing the import
        import mxamp.backend.cpu
        result["cpu_features"] = mxamp.backend.cpu.cpu_features().as_dict()
    TUNED.pop("_policy", None)
    result.update(TUNED)
    result.update(status="ok", median_ms=statistics.median(times), min_ms=min(times),
                  times_ms=[round(t, 3) for t in times], last_value=last)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS) + sorted(INIT_TARGETS))
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--quick", action="store_true", help="tiny batches (smoke test)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--policy", help="JSON file: mxamp_tuned saves its policy there, "
                        "mxamp_as_tuned reads it")
    args = parser.parse_args(argv)
    POLICY_FILE[:] = [args.policy] if args.policy else []
    try:
        result = measure(args.workload, args.mode, args.quick, args.steps, args.warmup)
        code = 0
    except Skip as why:
        result, code = {"status": "n/a", "error": str(why)}, 0
    except Exception as err:  # noqa: BLE001 - reported as an error cell by run_all
        traceback.print_exc()
        # MXNet puts the failed check on the last line of its (long) message.
        lines = [l.strip() for l in str(err).splitlines() if l.strip()] or [""]
        result, code = {"status": "error", "error": "%s: %s" % (type(err).__name__, lines[-1])}, 1
    result.update(workload=args.workload, mode=args.mode,
                  maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  # amp.tune's trials run in forked copies: the largest copy's peak
                  trials_maxrss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,
                  loadavg=os.getloadavg()[0])
    print("RESULT " + json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
