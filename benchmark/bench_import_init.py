"""`import mxamp` and the first `amp.init('bfloat16')`: two source trees side by side.

Alternates fresh processes of each tree (bytecode compiled first, as an installed package
has it) and prints the medians, in milliseconds. The numbers #23's note quotes came from

    git worktree add /tmp/before 387a278
    python benchmark/bench_import_init.py --before /tmp/before --after . --runs 40
"""
import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, time
t0 = time.perf_counter()
import mxnet
t1 = time.perf_counter()
import mxamp
t2 = time.perf_counter()
from mxamp import amp
amp.init('bfloat16')
t3 = time.perf_counter()
print(json.dumps({"import_mxamp_ms": (t2 - t1) * 1e3, "first_init_ms": (t3 - t2) * 1e3}))
"""


def run_once(tree, cache):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), XDG_CACHE_HOME=cache,
               MXAMP_PROBE="0", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=cache, check=True,
                         capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mxamp"], env=env, cwd=cache, check=True)
    row["python_c_import_ms"] = (time.perf_counter() - start) * 1e3
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a checkout to compare against")
    parser.add_argument("--after", default=".", help="the checkout measured (default: here)")
    parser.add_argument("--runs", type=int, default=10, help="processes per tree")
    args = parser.parse_args(argv)
    trees = {"before": args.before, "after": args.after}
    for tree in trees.values():
        compileall.compile_dir(os.path.join(tree, "mxamp"), quiet=1)
    rows = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as cache:     # never the user's probe cache
        for i in range(args.runs):
            order = list(trees.items()) if i % 2 == 0 else list(reversed(list(trees.items())))
            for name, tree in order:
                rows[name].append(run_once(tree, cache))
    for name, measured in rows.items():
        print(name, {key: round(statistics.median(r[key] for r in measured), 2)
                     for key in measured[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
