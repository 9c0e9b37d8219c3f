"""Replace the fla rows of every peer report (reports/peers/**/gpu.csv[.gz]) by the emulated rows remade here
(gpu-smoke-regressions.emulated.csv.gz, gpu-peers.emulated.csv.gz), row by row on (case_id, tensor, input_sha256);
rows the remade files do not hold stay. Prints, per file, how many rows it replaced and how many of them moved.

    python reports/h200-native/remake_peer_rows.py [--dry-run]"""

import argparse
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KEY = ["case_id", "tensor", "input_sha256"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    remade = pd.concat([pd.read_csv(HERE / f, dtype=str, keep_default_na=False)
                        for f in ("gpu-smoke-regressions.emulated.csv.gz", "gpu-peers.emulated.csv.gz")])
    remade = remade.drop_duplicates(KEY).set_index(KEY)
    for path in sorted((ROOT / "reports" / "peers").rglob("gpu.csv*")):
        rows = pd.read_csv(path, dtype=str, keep_default_na=False)
        if rows.empty or (rows["mode"] != "emulated").any():
            continue
        key = pd.MultiIndex.from_frame(rows[KEY])
        hit = key.isin(remade.index)
        new = remade.reindex(key[hit]).reset_index()[rows.columns]
        moved = (new["rel_l2"].values != rows.loc[hit, "rel_l2"].values).sum()  # as written: a moved value
        print(f"{path.relative_to(ROOT)}: {hit.sum()} of {len(rows)} rows replaced, {moved} with another rel_l2")
        if not args.dry_run and hit.any():
            rows.loc[hit, :] = new.values
            rows.to_csv(path, index=False, compression={"method": "gzip", "mtime": 0} if path.suffix == ".gz"
                        else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
