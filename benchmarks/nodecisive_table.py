"""The dev table of docs/tuning/smollm2_dev_4k.md, "The dominance rule under reorder".

Reads the committed rows of the ``nodecisive`` stage (vanilla and the preset with
``decisive_margin=None``) and derives the old preset's answer without a run: vanilla's where
its rule would have fired (not flat, top-two z gap >= 1.3), else the no-rule answer (the rule
is the only difference between the two configs).

    python benchmarks/nodecisive_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "benchmarks/results/tune_smollm2_dev_4k/nodecisive"
MARGIN = 1.3  # the old preset's decisive_margin


def table(folder: Path) -> dict:
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines() if line.strip()]
    by = {(r["method"], r["depth"], r["index"]): r for r in rows if not r.get("error")}
    out = {"n": 0, "fires": 0, "vanilla": 0, "preset": 0, "no_rule": 0, "wins": 0, "losses": 0}
    for (method, depth, index), new in sorted(by.items()):
        if method != "qgpm" or ("vanilla", depth, index) not in by:
            continue
        van = by[("vanilla", depth, index)]["correct"]
        z = new.get("top_z") or []
        fires = not new["flat_relevance"] and len(z) > 1 and z[0] - z[1] >= MARGIN
        preset = van if (fires or new["flat_relevance"]) else new["correct"]
        out["n"] += 1
        out["fires"] += fires
        out["vanilla"] += van
        out["preset"] += preset
        out["no_rule"] += new["correct"]
        out["wins"] += new["correct"] and not preset
        out["losses"] += preset and not new["correct"]
    return out


if __name__ == "__main__":
    print("| task | n | rule fires (preset) | vanilla | preset | no rule | b/c (no rule vs preset) |")
    print("|---|---|---|---|---|---|---|")
    for name in ("single", "nolima"):
        t = table(ROOT / name)
        print(f"| {name} | {t['n']} | {t['fires']} | {t['vanilla']} | {t['preset']} | {t['no_rule']} | {t['wins']}/{t['losses']} |")
