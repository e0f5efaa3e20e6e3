"""Runs a benchmark script with the CPU class forced to 'amx' (decisions only: the kernels are this
CPU's), steered or not:

    FORCE_AMX=1 [NOSTEER=1] python forced_amx_run.py worker WORKLOAD MODE [bench_worker options]
    FORCE_AMX=1 [NOSTEER=1] python forced_amx_run.py heap-phases MODE WORKLOAD

``worker`` is benchmark/bench_worker.py; ``heap-phases`` is ../heap-phases.py (glibc's live blocks).
"""
import os
import runpy
import sys
from dataclasses import replace

ROOT = os.path.abspath(__file__).split("/benchmark/")[0]
sys.path.insert(0, ROOT)
SCRIPTS = {"worker": os.path.join(ROOT, "benchmark", "bench_worker.py"),
           "heap-phases": os.path.join(ROOT, "benchmark", "results", "native-amd-epyc-zen4",
                                       "heap-phases.py")}
if os.environ.get("FORCE_AMX") == "1":
    from mxamp.backend import cpu
    cpu._CLASSIFIED = replace(cpu.cpu_features(), bf16_class="amx")
if os.environ.get("NOSTEER") == "1":
    from mxamp.runtime import hooks
    hooks._depthwise_treatment = lambda block, args: ""
script = SCRIPTS[sys.argv[1]]
sys.argv = [os.path.basename(script)] + sys.argv[2:]
runpy.run_path(script, run_name="__main__")
