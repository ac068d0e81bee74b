import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
agg = collections.defaultdict(lambda: [0.0, 0])
for r in rows:
    if "Kernel Name" in r and "Metric Value" in r:
        hdr = r; continue
    if hdr is None or len(r) != len(hdr): continue
    d = dict(zip(hdr, r))
    if d.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(d["Metric Value"].replace(",", ""))
    unit = d.get("Metric Unit", "nsecond")
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
    name = d["Kernel Name"].split("(")[0][:70]
    agg[name][0] += v * scale; agg[name][1] += 1
tot = sum(a[0] for a in agg.values())
print(f"total kernel time {tot:.0f} us over {sum(a[1] for a in agg.values())} kernels")
for k, (us, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:18]:
    print(f"{us:9.0f} us {n:5d}x  {k}")
