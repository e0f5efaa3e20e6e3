"""Sums two bigtrace dumps by call stack (first 6 frames) and prints where the first holds more."""
import sys, collections
def load(p, depth=6):
    agg = collections.Counter(); cnt = collections.Counter(); cur = None; frames = []
    def flush():
        if cur is not None:
            key = " | ".join(f.split(" ", 1)[1] if " " in f else f for f in frames[:depth]); agg[key] += cur; cnt[key] += 1
    for line in open(p):
        if line.startswith("ALLOC"):
            flush(); cur = int(line.split()[1]); frames = []
        else:
            frames.append(line.strip())
    flush()
    return agg, cnt
a, ca = load(sys.argv[1]); b, cb = load(sys.argv[2])
print("total MB", sum(a.values())/2**20, sum(b.values())/2**20)
for k in sorted(set(a) | set(b), key=lambda k: -(a[k] - b[k])):
    d = (a[k] - b[k]) / 2**20
    if abs(d) > 0.5: print("%+7.1f MB  (%d vs %d blocks)  %s" % (d, ca[k], cb[k], k[:600]))
