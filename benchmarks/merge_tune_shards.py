"""Merge the shard folders of one `qgpm tune --shard i/N` stage into one committed folder.

    python benchmarks/merge_tune_shards.py OUT_DIR SHARD_DIR [SHARD_DIR ...] [--note TEXT]

Keeps the rows of the stage's own samples (the (task, length, depth, seed) of its qgpm
rows; vanilla rows that `scripts/tune_4k.sh` seeded from other stages are dropped unless
they answer one of those samples) and of its own trials (config hashes in the shards'
trials.jsonl), deduplicated. Writes OUT_DIR/tune_rows.jsonl and OUT_DIR/trials.jsonl
(config hash -> config, as the shards wrote them). Used for stages stopped before the
unsharded summary run; `python benchmarks/tune_map.py OUT_DIR` reads the result.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("shards", nargs="+")
    ap.add_argument("--note", default="written after the shards were merged (benchmarks/merge_tune_shards.py)")
    a = ap.parse_args()
    trials: dict[str, dict] = {}
    rows: list[dict] = []
    for d in map(Path, a.shards):
        tf = d / "trials.jsonl"
        if tf.exists():
            for line in tf.read_text().splitlines():
                t = json.loads(line)
                if t.get("config_hash") and "config" in t:
                    if t["config_hash"] in trials and trials[t["config_hash"]] != t["config"]:
                        raise SystemExit(f"config hash {t['config_hash']} has two configs in the shards")
                    trials[t["config_hash"]] = t["config"]
        rows += [json.loads(line) for line in (d / "tune_rows.jsonl").read_text().splitlines() if line.strip()]
    sample = lambda r: (r["task"], r["length"], r["depth"], r["seed"])
    samples = {sample(r) for r in rows if r["method"] != "vanilla" and r["config_hash"] in trials}
    best: dict[tuple, dict] = {}  # one row per key: the first answer, or a later answer over an error row (a retry)
    for r in rows:
        key = sample(r) + (r["method"], r["config_hash"])
        if sample(r) in samples and (r["method"] == "vanilla" or r["config_hash"] in trials):
            old = best.get(key)
            if old is None or (old.get("error") and not r.get("error")):
                best[key] = r
    keep = list(best.values())
    keep.sort(key=lambda r: (r["task"], r["depth"], r["seed"], r["method"] != "vanilla", r["config_hash"]))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep))
    (out / "trials.jsonl").write_text("".join(json.dumps({"config_hash": h, "config": c, "note": a.note}) + "\n" for h, c in trials.items()))
    print(f"{len(keep)} rows, {len(samples)} samples, {len(trials)} trials -> {out}")


if __name__ == "__main__":
    main()
