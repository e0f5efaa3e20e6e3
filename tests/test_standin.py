"""Unmodified scripts and libraries get mxamp: ``mxamp.install``, ``python -m mxamp run``, a
bare ``amp.init()`` that pays where it can, and re-initialising as the reference does.

What a bare ``amp.init()`` computes here is worked out by ``tests/bf16_expect.py`` from
/proc/cpuinfo and the environment (the probe is off in the suite, so 'auto' follows the
documented class rule), not by asking mxamp.
"""
import logging
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

import mxamp
from mxamp import amp
from mxamp.runtime.state import STATE
from bf16_expect import AUTO_BY_CLASS, where
from side_by_side import map_side_by_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("mxnet.contrib.amp", "mxnet.contrib.amp.amp", "mxnet.contrib.amp.lists",
         "mxnet.contrib.amp.lists.symbol_fp16", "mxnet.contrib.amp.lists.symbol_bf16",
         "mxnet.contrib.amp.lists.symbol")


@pytest.fixture
def installed(amp_off):
    before = {name: sys.modules.get(name) for name in NAMES}
    contrib_amp = mx.contrib.amp
    mxamp.install()
    yield before, contrib_amp
    mxamp.uninstall()


def _reference_names():
    return {name: sys.modules.get(name) for name in NAMES}, mx.contrib.amp


def test_every_import_form_gives_mxamps_amp(installed):
    import mxnet.contrib.amp as imported                       # noqa: E402
    from mxnet.contrib import amp as from_contrib              # noqa: E402
    from mxnet.contrib.amp import amp as from_package          # noqa: E402
    from mxnet.contrib.amp.lists import symbol_fp16            # noqa: E402
    assert imported is amp and from_contrib is amp and from_package is amp
    assert symbol_fp16 is mxamp.lists.symbol_fp16
    assert mxamp.is_installed()


def test_the_initialized_flag_tracks_init_and_reset(installed):
    from mxnet.contrib import amp as ref
    assert ref._amp_initialized is False and ref.amp._amp_initialized is False
    ref.init("bfloat16")
    assert ref._amp_initialized is True and ref.amp._amp_initialized is True, \
        "GluonNLP's attention cell reads amp._amp_initialized (0.9+) or amp.amp's (0.7/0.8)"
    ref.reset()
    assert ref._amp_initialized is False and ref.amp._amp_initialized is False


def test_install_twice_is_harmless_and_uninstall_restores_the_reference_exactly(amp_off):
    before = _reference_names()
    assert before[1] is not amp and before[1].__name__ == "mxnet.contrib.amp"
    mxamp.install()
    mxamp.install("bfloat16")
    assert STATE.install_target == "bfloat16", "a second install changes only the target"
    mxamp.uninstall()
    after = _reference_names()
    assert all(after[0][k] is before[0][k] for k in NAMES), \
        "sys.modules entries are the very modules they were"
    assert after[1] is before[1], "mx.contrib.amp is the reference's package again"
    assert STATE.install_target is None and not mxamp.is_installed()
    mxamp.uninstall()   # harmless when not installed


def test_install_refuses_a_bad_target_and_changes_nothing(amp_off):
    before = _reference_names()
    with pytest.raises(ValueError, match="target_dtype must be float16 or bfloat16"):
        mxamp.install("int8")
    assert _reference_names()[1] is before[1] and not mxamp.is_installed()


@pytest.mark.cpu_class
def test_a_bare_init_means_auto_without_a_gpu(amp_off, caplog):
    assert mx.context.num_gpus() == 0, "this test describes a process without a GPU"
    with caplog.at_level(logging.INFO, logger="mxamp"):
        amp.init()
    assert STATE.plan.requested == "auto"
    assert amp.patch_state()["cpu_compute"] == AUTO_BY_CLASS, where()
    said = [r.getMessage() for r in caplog.records if "without target_dtype" in r.getMessage()]
    assert len(said) == 1 and "'auto'" in said[0], said


def test_installs_target_is_what_a_bare_init_means(installed):
    mxamp.install("bfloat16")
    amp.init()
    assert STATE.plan.requested == "bfloat16"


def test_an_explicit_float16_keeps_its_meaning_and_a_float16_model_still_runs(amp_off):
    amp.init("float16")
    assert STATE.plan.requested == "float16"
    net = mx.gluon.nn.Dense(4, in_units=8)
    net.initialize()
    net.cast("float16")
    y = net(mx.nd.ones((2, 8), dtype="float16"))
    assert np.isfinite(y.asnumpy()).all(), "float16 on a CPU: computed in float32 with casts"


def test_a_bare_init_with_a_float16_model_runs(amp_off):
    """A GPU script run on a CPU: a bare init(), then net.cast('float16') (today's path)."""
    amp.init()
    net = mx.gluon.nn.Dense(4, in_units=8)
    net.initialize()
    net.cast("float16")
    y = net(mx.nd.ones((2, 8), dtype="float16"))
    assert np.isfinite(y.asnumpy().astype(np.float32)).all()


def test_reinit_keeps_the_first_configuration_like_the_reference(amp_off):
    # FullyConnected is low precision by default: float32 only if the first init's lists hold
    amp.init("bfloat16", fp32_ops=["FullyConnected"])
    generation = STATE.generation
    amp.init()                                         # a library's own bare amp.init()
    amp.init("bfloat16", fp32_ops=["FullyConnected"])  # the same explicit arguments
    assert STATE.generation == generation and STATE.plan.requested == "bfloat16"
    assert STATE.plan.lists.category("FullyConnected") == "fp32"
    with pytest.raises(RuntimeError, match="target_dtype='bfloat16'.*target_dtype='float16'"):
        amp.init("float16")
    assert STATE.plan.requested == "bfloat16", "a refused init leaves the first in force"


def test_layout_optimization_is_accepted(amp_off):
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        amp.init("bfloat16", layout_optimization=False)
    assert not [w for w in seen if "layout" in str(w.message)], "False is silent"
    amp.reset()
    with pytest.warns(RuntimeWarning, match="layout_optimization=True.*does not do it"):
        amp.init("bfloat16", layout_optimization=True)


def test_the_reference_15_name_of_the_float16_lists():
    assert amp.lists.symbol is amp.lists.symbol_fp16
    assert "FullyConnected" in amp.lists.symbol.FP16_FUNCS


SCRIPT = """
import sys
from mxnet.contrib import amp            # unmodified: the reference's import
amp.init()                               # unmodified: a bare init, as GPU scripts have
import mxamp
from mxamp.runtime.state import STATE
print("ARGV", sys.argv[1:])
print("REQUESTED", STATE.plan.requested)
print("COMPUTE", amp.patch_state()["cpu_compute"], "IS_MXAMP", amp is mxamp.amp)
sys.exit(int(sys.argv[1]))
"""


def _run(args, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "mxamp", "run"] + args(str(script)),
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))


@pytest.mark.cpu_class
def test_mxamp_run_installs_runs_the_script_and_passes_its_exit_code(tmp_path):
    proc = _run(lambda s: [s, "3", "--lr", "0.1"], tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "ARGV ['3', '--lr', '0.1']" in proc.stdout, proc.stdout
    assert "REQUESTED auto" in proc.stdout, "no --target: a bare init means 'auto'"
    assert "COMPUTE %s IS_MXAMP True" % AUTO_BY_CLASS in proc.stdout, (proc.stdout, where())


def test_mxamp_run_target_sets_what_the_bare_init_means(tmp_path):
    proc, bad = map_side_by_side(lambda target: _run(lambda s: ["--target", target, s, "0"],
                                                     tmp_path / target), ["float16", "int8"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REQUESTED float16" in proc.stdout, "--target float16: %s" % proc.stdout
    assert "COMPUTE float32 IS_MXAMP True" in proc.stdout, \
        "float16 on a CPU computes in float32: %s" % proc.stdout
    assert bad.returncode != 0 and "--target" in bad.stderr, bad.stderr[-500:]


def test_gluoncv_faster_rcnn_forward_backward_task_trains_a_step_with_mxamp(installed):
    """GluonCV's own R-CNN task, unedited: it imports ``mxnet.contrib.amp`` inside
    ``forward_backward`` and calls ``amp.scale_loss``. With mxamp installed, that is mxamp's,
    and one real step (random weights: ``pretrained_base=False``; one synthetic 256x320
    image with one box) updates the weights through mxamp's loss scaler."""
    gluoncv = pytest.importorskip("gluoncv")
    from gluoncv.data.batchify import FasterRCNNTrainBatchify
    from gluoncv.data.transforms.presets.rcnn import FasterRCNNDefaultTrainTransform
    from gluoncv.model_zoo.rcnn.faster_rcnn.data_parallel import ForwardBackwardTask
    mx.random.seed(0)
    rng = np.random.RandomState(0)
    amp.init()                        # the training script's bare amp.init()
    net = gluoncv.model_zoo.get_model("faster_rcnn_resnet50_v1b_voc", pretrained=False,
                                      pretrained_base=False)
    net.initialize(mx.init.Xavier(magnitude=2))
    # 256x320: the smallest size whose 4,800 anchors cover GluonCV's 2,000 proposals
    transform = FasterRCNNDefaultTrainTransform(256, 320, net)
    image = mx.nd.array(rng.randint(0, 255, (256, 320, 3)), dtype="uint8")
    label = np.array([[20.0, 30.0, 90.0, 110.0, 3.0]])
    batch = FasterRCNNTrainBatchify(net)([transform(image, label)])   # GluonCV's own loader step
    sample = [b[0] if isinstance(b, (list, tuple)) else b for b in batch]
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.001})
    amp.init_trainer(trainer)
    task = ForwardBackwardTask(net, trainer, mx.gluon.loss.SigmoidBinaryCrossEntropyLoss(
        from_sigmoid=False), mx.gluon.loss.HuberLoss(rho=1.0 / 9), mx.gluon.loss.
        SoftmaxCrossEntropyLoss(), mx.gluon.loss.HuberLoss(rho=1.0), 1.0, amp_enabled=True)
    losses = task.forward_backward(sample)
    weight = net.collect_params()[sorted(net.collect_params())[-1]]
    before = weight.data().asnumpy().copy()
    trainer.step(1)
    values = [float(l.asscalar()) for l in losses[:4]]
    assert all(np.isfinite(v) for v in values), values
    scaler = trainer._amp_loss_scaler
    assert type(scaler).__module__ == "mxamp.training.trainer_scaler", type(scaler)
    after = weight.data().asnumpy()
    assert not np.array_equal(before, after), "the step updated the weights"


def test_mxamp_run_under_mxamps_launcher(tmp_path):
    """``python -m mxamp.launch -n 2 -- python -m mxamp run train.py``: each worker runs the
    unmodified script with mxamp installed, and the kvstore job completes."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import mxnet as mx
        from mxnet.contrib import amp
        import mxamp
        amp.init()
        kv = mx.kv.create('dist_sync')
        out = mx.nd.zeros((2,))
        kv.init(3, mx.nd.zeros((2,)))
        kv.pushpull(3, mx.nd.ones((2,)), out=out)
        print('rank=%d mxamp=%s sum=%g' % (kv.rank, amp is mxamp.amp, out[0].asscalar()))
    """))
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "mxamp.launch", "-n", "2", "-s", "1",
                           "--timeout", "120", "--", sys.executable, "-m", "mxamp", "run",
                           str(worker)], capture_output=True, text=True, env=env, timeout=200,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for rank in range(2):
        assert "rank=%d mxamp=True sum=2" % rank in proc.stdout + proc.stderr, proc.stdout


def test_the_mxamp_run_console_script_does_the_same(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    command = os.path.join(os.path.dirname(sys.executable), "mxamp-run")
    assert os.path.exists(command), "pip install mxamp puts mxamp-run next to python (setup.py)"
    proc = subprocess.run([command, str(script), "5"], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 5 and "IS_MXAMP True" in proc.stdout, proc.stderr[-2000:]


GLUONNLP_MASK = """
import sys
import mxamp
if sys.argv[1] == "install-first":
    mxamp.install()
import gluonnlp.model.attention_cell as cell   # does `from mxnet.contrib.amp import amp`
if sys.argv[1] == "gluonnlp-first":
    mxamp.install()
import mxnet as mx
from mxamp import amp
score, mask = mx.nd.zeros((1, 1, 2)), mx.nd.array([[[1, 0]]])
print("OFF %g" % cell._apply_mask(mx.nd, score, mask, "float32")[0, 0, 1].asscalar())
amp.init("bfloat16")
print("ON %g" % cell._apply_mask(mx.nd, score, mask, "float32")[0, 0, 1].asscalar())
amp.reset()
print("RESET %g" % cell._apply_mask(mx.nd, score, mask, "float32")[0, 0, 1].asscalar())
"""


@pytest.mark.parametrize("order", ["install-first", "gluonnlp-first"])
def test_gluonnlp_attention_masks_with_an_amp_safe_value_under_mxamp(order, tmp_path):
    """GluonNLP 0.10's attention cell fills masked scores with -1e18, or -1e4 when
    ``amp._amp_initialized`` (-1e18 overflows in half precision). Its own ``_apply_mask``,
    imported before or after ``mxamp.install()``, sees mxamp's init and reset."""
    pytest.importorskip("gluonnlp", reason="the test extra installs gluonnlp==0.10.0")
    script = tmp_path / "mask.py"
    script.write_text(GLUONNLP_MASK)
    proc = subprocess.run([sys.executable, str(script), order], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["OFF", "-1e+18", "ON", "-10000", "RESET", "-1e+18"], \
        proc.stdout


def test_the_doctor_says_whether_mxamp_is_installed(installed):
    from mxamp import doctor
    facts = doctor.collect(timing=False, probe=False)
    assert facts["installed"] is True
    assert "mxnet.contrib.amp is mxamp" in doctor.format_report(facts)
    mxamp.uninstall()
    facts = doctor.collect(timing=False, probe=False)
    assert facts["installed"] is False
    assert "mxnet.contrib.amp is MXNet's own" in doctor.format_report(facts)
