"""The accuracy report (mxamp.compare): per-layer errors and dtypes on ResNet-18, and the CLI.

The report says what ran: bfloat16 convolutions where this CPU has bfloat16 kernels, float32
everywhere (and zero error) where it has none.
"""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from bf16_expect import BF16_KERNELS, LOW_NAME, where
from mxamp.compare import AccuracyReport, LayerError, accuracy_report, main


@pytest.fixture(scope="module")
def resnet18_report():
    mx.random.seed(11)
    np.random.seed(11)
    net = mx.gluon.model_zoo.vision.resnet18_v1(prefix="resnetv10_")
    net.initialize(mx.init.Xavier())
    net.hybridize()
    images = mx.nd.random.uniform(shape=(4, 3, 224, 224))
    return accuracy_report(net, images, "bfloat16",
                           excluded_sym_names=["resnetv10_conv0_fwd"])


@pytest.mark.cpu_class
def test_resnet18_bf16_report_numbers(resnet18_report):
    report = resnet18_report
    # measured (Zen 4): output 0.0041 native, 0.0040 emulated, 0 on none; the largest layer
    # error 0.0073 / 0.0073 (stage3_conv4). Bounds: 2.5x and 2.7x those; not measured on AMX.
    assert report.output_rel_error < 0.01, "output error %.4f >= 1%%" % report.output_rel_error
    assert report.top1_agreement == 1.0, "top-1 agreement %.2f" % report.top1_agreement
    assert len(report.layers) == 68, "ResNet-18 has 68 op outputs, report has %d" % len(
        report.layers)
    assert all(0 <= l.rel_error < 0.02 for l in report.layers), \
        "a layer error is out of range: %s" % report.worst(1)
    assert report.samples == 4
    if BF16_KERNELS:
        assert report.casts > 0, "a bfloat16 graph has casts %s" % where()
    else:
        assert report.casts == 0, "nothing is cast %s, found %d casts" % (where(), report.casts)
        assert report.output_rel_error == 0.0 and all(l.rel_error == 0.0 for l in report.layers), \
            "float32 compute %s must give float32's outputs exactly: %s" % (where(),
                                                                           report.worst(1))


@pytest.mark.cpu_class
def test_report_says_which_op_ran_in_which_dtype(resnet18_report):
    by_name = {l.name: l for l in resnet18_report.layers}
    conv0 = by_name["resnetv10_conv0_fwd_output"]
    assert (conv0.dtype, conv0.rel_error) == ("float32", 0.0), \
        "excluded conv0 must run in float32 exactly, got %s %.2g" % (conv0.dtype, conv0.rel_error)
    assert by_name["resnetv10_stage1_conv0_fwd_output"].dtype == LOW_NAME, \
        "the other convolutions run in %s %s" % (LOW_NAME, where())
    want = {"float32": 1, "bfloat16": 19} if BF16_KERNELS else {"float32": 20}
    assert resnet18_report.op_dtypes["Convolution"] == want, \
        "Convolution dtypes %s: %s" % (where(), resnet18_report.op_dtypes["Convolution"])
    text = resnet18_report.format()
    assert "resnetv10_stage4_conv4_fwd_output" in text and "top-1 agreement with float32: 4/4" \
        in text, "the text report lacks a layer row or the agreement line"


def test_worst_orders_by_error():
    layers = [LayerError("a", "relu", "bfloat16", 0.01), LayerError("b", "conv", "bfloat16", 0.3),
              LayerError("c", "fc", "float32", 0.0)]
    report = AccuracyReport("bfloat16", 0.01, 1.0, 2, layers)
    assert [l.name for l in report.worst(2)] == ["b", "a"], "worst() must sort by error"


@pytest.mark.cpu_class
def test_cli_prints_the_report_and_checks_the_threshold():
    # output error measured (Zen 4): 0.0058 native, 0.0057 emulated, 0 on none; the threshold
    # is 2.6x that (not measured on AMX)
    cmd = [sys.executable, "-m", "mxamp.compare", "--model", "resnet18_v1", "--batch", "2",
           "--size", "64", "--worst", "3", "--max-rel-error", "0.015"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, "CLI failed (%d):\n%s" % (proc.returncode, proc.stderr[-2000:])
    out = proc.stdout
    assert "output relative L2 error vs float32" in out and "Convolution" in out, out[-1500:]
    rows = [l for l in out.splitlines() if l.startswith("resnetv10_")]
    assert len(rows) == 3, "--worst 3 must print 3 layer rows, got %d" % len(rows)


def test_cli_rejects_bad_arguments_with_a_message(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--model", "resnet_does_not_exist"])
    assert exc.value.code == 2 and "resnet_does_not_exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--model", "resnet18_v1", "--dtype", "float16", "--batch", "1", "--size", "32"])
    assert exc.value.code == 2 and "float16 has no CPU kernel" in capsys.readouterr().err, \
        "float16 on a CPU must be refused with the reason"
