"""``python -m mxamp.doctor``: the report a user reads, checked against this machine's class."""
import json
import os
import subprocess
import sys

import pytest

from bf16_expect import AUTO_BY_CLASS, BF16_KERNELS, CPU_CLASS, where

pytestmark = pytest.mark.cpu_class

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doctor(*args):
    return subprocess.run([sys.executable, "-m", "mxamp.doctor", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_json_facts_agree_with_onednn_and_time_what_runs():
    proc = doctor("--json", "--seconds", "0.05")
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stdout)
    assert facts["cpu"]["bf16_class"] == CPU_CLASS, facts["cpu"]
    assert (facts["onednn"]["gemm"] == "runs") == BF16_KERNELS, facts["onednn"]
    # oneDNN's own ISA line, judged against the table (as tests/test_cpu.py does). Zen 4 here:
    # native "Intel AVX-512 with Intel DL Boost and bfloat16 support", emulated (AVX512_CORE)
    # "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions", none (AVX2) "Intel AVX2"
    isa = facts["onednn"]["isa"]
    assert isa not in ("", "unknown"), "oneDNN's ISA line was not read"
    assert ("bfloat16 support" in isa) == (CPU_CLASS in ("native", "amx")), (isa, where())
    assert ("AMX" in isa) == (CPU_CLASS == "amx"), (isa, where())
    # with the class established above, the doctor must call it consistent
    assert facts["consistent"] is True, "the class matches what oneDNN did: %s" % (
        facts["onednn"],)
    for workload, row in facts["timing"].items():
        assert row["float32"] > 0, (workload, row)
        assert ("bfloat16" in row) == BF16_KERNELS, "bf16 is timed exactly where it runs %s: " \
            "%s" % (where(), row)
    assert len(facts["timing"]) == 2, "one GEMM and one convolution: %s" % facts["timing"]
    plans = facts["plans"]
    assert plans["cpu/float16"]["compute"] == "float32", "float16 never computes on a CPU"
    assert plans["cpu/bfloat16"]["compute"] == ("bfloat16" if BF16_KERNELS else "float32")
    # the probe is off (conftest.py sets MXAMP_PROBE=0, which the child inherits): the class rule
    assert plans["cpu/auto"]["compute"] == AUTO_BY_CLASS, plans["cpu/auto"]


def test_text_report_names_the_class_and_what_init_does():
    proc = doctor("--no-timing")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "bfloat16 class: %s" % CPU_CLASS in out, out
    assert "oneDNN reports:" in out and "What amp.init(target_dtype=...) computes here:" in out
    assert "Timing" not in out, "--no-timing must skip the timing"
    said = {None: "on peak growth", "0": "never", "1": "every step"}[
        os.environ.get("MXAMP_TRIM_HEAP")]   # the README's table of environment variables
    assert "C heap trim in amp.scale_loss: %s" % said in out, out
    if not BF16_KERNELS:
        assert "bfloat16 requested; float32 compute: this CPU has no bfloat16 kernels" in out, out


def test_bad_arguments_are_refused():
    proc = doctor("--seconds", "0")
    assert proc.returncode == 2 and "--seconds must be positive" in proc.stderr, proc.stderr
