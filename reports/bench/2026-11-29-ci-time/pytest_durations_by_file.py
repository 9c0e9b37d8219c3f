import re, sys, collections
tot = collections.Counter(); n = collections.Counter(); allt = 0
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d.]+)s (call|setup|teardown)\s+(\S+?)::(\S+)", line)
    if m:
        s = float(m.group(1)); f = m.group(3); tot[f] += s; allt += s
        if m.group(2) == "call": n[f] += 1
print(f"total test seconds {allt:.0f}")
for f, s in tot.most_common(40): print(f"{s:7.1f}s {n[f]:4d} tests  {f}")
