"""One bench_worker.py process, summarised on one line: MXNet's storage growth in the second
step (step_storage_mb), the resident peak and the step times. TAG names the setting."""
import sys, io, contextlib, json, os
ROOT = os.path.abspath(__file__).split("/benchmark/")[0]   # the checkout this file is in
sys.path.insert(0, ROOT + "/benchmark"); sys.path.insert(1, ROOT)
import bench_worker
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    bench_worker.main(sys.argv[1:])
line = [l for l in buf.getvalue().splitlines() if l.startswith("RESULT ")][-1]
r = json.loads(line[7:])
tag = os.environ.get("TAG", "default")
print("%-17s %-9s %-14s storage %7.1f MB  peak %7.1f MB  median %7.1f ms  min %7.1f ms %s" % (
    r["workload"], r["mode"], tag, r.get("step_storage_mb") or -1, r["maxrss_mb"], r.get("median_ms", -1), r.get("min_ms", -1), r.get("status")), flush=True)
