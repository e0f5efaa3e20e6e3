"""Sum oneDNN verbose exec times by (kind, impl, prop, dtypes) from stdin; print the top rows."""
import sys, collections
tot = collections.Counter(); cnt = collections.Counter()
for line in sys.stdin:
    if not line.startswith("dnnl_verbose,exec"):
        continue
    f = line.strip().split(",")
    try:
        t = float(f[-1])
    except ValueError:
        continue
    dts = " ".join(sorted({p.split(":")[0].split("_")[-1] + "" for p in f[6].split()}))
    key = (f[3], f[4], f[5], f[6][:60])
    tot[key] += t; cnt[key] += 1
all_t = sum(tot.values())
print("total ms %.1f over %d calls" % (all_t, sum(cnt.values())))
for k, v in tot.most_common(25):
    print("%8.1f ms %5.1f%% n=%-4d %s" % (v, 100 * v / all_t, cnt[k], " | ".join(k)))
