# One bench_worker process of TREE (a checkout) for WORKLOAD MODE; prints its median and fastest
# step (ms), peak resident MB and the minor page faults it took (getrusage of the child).
# usage: python faults.py TREE WORKLOAD MODE LABEL   (STEPS: timed steps, default 8)
import resource, subprocess, sys, os, json
tree, wl, mode, label = sys.argv[1:5]
steps = os.environ.get("STEPS", "8")
r = subprocess.run([sys.executable, "benchmark/bench_worker.py", wl, mode, "--steps", steps, "--warmup", "3"], capture_output=True, text=True, cwd=tree)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
res = json.loads(r.stdout.split("RESULT",1)[1])
print("%-5s %-16s %-20s median %6.0f min %6.0f peak %5.0f minflt %7d" % (label, wl, mode, res["median_ms"], res["min_ms"], res["maxrss_mb"], ru.ru_minflt), flush=True)
