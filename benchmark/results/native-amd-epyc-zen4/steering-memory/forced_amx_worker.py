"""bench_worker with the CPU class forced to 'amx' (decisions only: the kernels are this CPU's)."""
import os, sys, runpy
from dataclasses import replace
ROOT = os.path.abspath(__file__).split("/benchmark/")[0]
sys.path.insert(0, ROOT)
if os.environ.get("FORCE_AMX") == "1":
    from mxamp.backend import cpu
    cpu._CLASSIFIED = replace(cpu.cpu_features(), bf16_class="amx")
if os.environ.get("NOSTEER") == "1":
    from mxamp.runtime import hooks
    hooks._depthwise_treatment = lambda block, args: ""
sys.argv = ["bench_worker.py"] + sys.argv[1:]
runpy.run_path(os.path.join(ROOT, "benchmark", "bench_worker.py"), run_name="__main__")
