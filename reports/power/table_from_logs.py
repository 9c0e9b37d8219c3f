"""The power table from the study's logs (tests/power.py prints one line per grade tried).

    python reports/power/table_from_logs.py reports/power/2026-11-24/*.log

The study of 2026-11-24 ran as four processes, one or two classes each. It was stopped at the session's end
before some classes reached their first miss, so their logs are the record, and a class without a miss reads
"≥ N". BEFORE is the 2026-11-22 study's smallest caught grade (2026-11-22/power.md: 24 cases, a single draw
decided a catch).
"""

import re
import sys

BEFORE = {"state rounded per chunk": 9, "scores rounded twice": 9, "f32 dots at fewer bits": 10,
          "fp16 inputs at fewer bits": 9, "products at fewer bits": None}
GRADE = re.compile(r"^  (?P<name>.+?) at (?P<bits>\d+) bits: (?P<outcome>caught|not caught) "
                   r"\((?P<cases>\d+) cases, [\d.]+ s\)(?: (?P<case>\S+) (?P<tensor>\S+) (?P<metric>\S+) "
                   r"(?P<verdict>\S+) at (?P<draws>\S+) draw)?")

caught, missed = {}, {}
for path in sys.argv[1:]:
    for line in open(path):
        m = GRADE.match(line)
        if m and m["outcome"] == "caught":
            caught.setdefault(m["name"], []).append(m)
        elif m:
            missed[m["name"]] = int(m["bits"])

print("| class | 2026-11-22 (24 cases) | 2026-11-24: smallest caught | first missed | the catch at the smallest |")
print("|---|---|---|---|---|")
for name, before in BEFORE.items():
    if name not in caught:
        print(f"| {name} | {before} | not run | | |")
        continue
    best = max(caught[name], key=lambda m: int(m["bits"]))
    miss = missed.get(name)
    smallest = best["bits"] if miss is not None else f"≥ {best['bits']} (stopped before its first miss)"
    print(f"| {name} | {before if before else '– (class added later)'} | {smallest} | {miss or '–'} | "
          f"{best['case']} `{best['tensor']}` {best['metric']}, {best['verdict']} at {best['draws']} draw(s), "
          f"after {best['cases']} cases |")
