"""Docs that cannot drift: the API page is generated from the code, the architecture page
lists every module, and what the README says about CI is what ``.ci/run`` does."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_api_page_is_generated_from_the_current_docstrings():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "gen_api.py"), "--check"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, ("docs/api.md is stale: run `python docs/gen_api.py`\n%s%s"
                                  % (proc.stdout[-1500:], proc.stderr[-1500:]))


def test_architecture_page_lists_every_module():
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    missing = []
    for folder, _, files in os.walk(os.path.join(ROOT, "mxamp")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), os.path.join(ROOT, "mxamp"))
            shown = rel.replace(os.sep, "/")
            if "`%s`" % shown not in text and "`%s`" % shown.split("/")[-1] not in text:
                missing.append(shown)
    assert not missing, "docs/architecture.md does not describe: %s" % missing


def test_readme_says_what_ci_runs():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    steps = ["bash ci/test.sh", "bash ci/test.sh -m cpu_class", "ci/probe_amx.py",
             "bash ci/horovod.sh -k horovod"]
    for step in steps:
        assert step in ci, ".ci/run no longer runs %r" % step
        assert step in readme, "README does not mention what CI runs: %s" % step
    for setting in ("MXAMP_AMX=1", "DNNL_MAX_CPU_ISA=AVX512_CORE", "DNNL_MAX_CPU_ISA=AVX2"):
        assert setting in ci and setting in readme, (
            "the class matrix setting %s must be in .ci/run and the README" % setting)
    test_sh = open(os.path.join(ROOT, "ci", "test.sh")).read()
    assert "--doctest-modules tests mxamp" in test_sh, "ci/test.sh runs tests and doctests"
    assert re.search(r"^bash ci/test\.sh", readme, re.M), "the README opens with the test command"
