"""The comparison table of docs/results.md for the query-agnostic RoPE baselines,
from the committed test rows: on the samples where STRING, Ms-PoE and Self-Extend ran, every
method's accuracy with its wins / losses against vanilla, the exact McNemar p over all tasks,
the mean gold log-prob difference and the mean wall time per answer.

    python benchmarks/baselines_table.py                    # 4096 tokens
    python benchmarks/baselines_table.py --length 2048

"qgpm (shipped)" is the shipped preset's answer per sample, as the README's results table
counts it: the newest preset series that ran on the sample (``a23b32``, else ``dc58f6``, else
``7cefc6``: each later series re-ran only the samples its change could touch), and vanilla's
answer where none ran (there the flat-relevance rule keeps vanilla positions, which gives
vanilla's answer).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

from qgpm.eval.significance import mcnemar_exact

ROWS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "eval_smollm2_test" / "rows.jsonl"
BASELINES = ("string", "ms-poe", "self-extend")
PRESET_SERIES = ("a23b32", "dc58f6", "7cefc6")  # newest first
TASKS = ("niah_multikey_1", "niah_multivalue", "niah_single_2", "nolima_direct", "qa_1")


def total_cell(right: int, wins: int, losses: int, n: int, *, complete: bool, baseline: bool) -> str:
    """A totals-row cell: "–" unless the method has every sample; % right, and for a method
    other than the baseline its wins / losses against it with the exact McNemar p."""
    if not complete:
        return "–"
    if baseline:
        return f"{100 * right / n:.1f}"
    return f"{100 * right / n:.1f} ({wins}/{losses}, p {mcnemar_exact(wins, losses):.2g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=str(ROWS))
    ap.add_argument("--length", type=int, default=4096)
    args = ap.parse_args(argv)

    by = collections.defaultdict(dict)  # (task, depth, index) -> method -> row
    for line in Path(args.rows).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["length"] != args.length or r.get("error"):
            continue
        key = (r["task"], r["depth"], r["index"])
        m = r["method"]
        if m == "qgpm":
            h = r["config_hash"][:6]
            if h not in PRESET_SERIES:
                continue
            old = by[key].get("qgpm")
            if old is not None and PRESET_SERIES.index(old["config_hash"][:6]) <= PRESET_SERIES.index(h):
                continue
        elif m == "oracle":
            if not r["config_hash"].startswith("cf83ac"):
                continue
        by[key][m] = r
    samples = sorted(k for k, ms in by.items() if all(b in ms for b in BASELINES) and "vanilla" in ms)
    if not samples:
        raise SystemExit(f"no {args.length}-token sample has rows for vanilla and all of {', '.join(BASELINES)}")
    methods = ["vanilla", "qgpm", "topk", "reorder", "oracle", *BASELINES]
    label = {"qgpm": "qgpm (shipped)", "oracle": "oracle (reorder)"}

    def answer(key, m):
        ms = by[key]
        if m == "qgpm" and "qgpm" not in ms:
            return ms["vanilla"]  # flat relevance: vanilla positions, vanilla's answer
        return ms.get(m)

    print(f"{len(samples)} samples at {args.length} tokens with vanilla, {', '.join(BASELINES)} rows")
    print()
    print("| task | n | " + " | ".join(label.get(m, m) for m in methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    totals = {m: [0, 0, 0, 0] for m in methods}  # right, b, c, n
    for task in TASKS + tuple(sorted({k[0] for k in samples} - set(TASKS))):
        keys = [k for k in samples if k[0] == task]
        if not keys:
            continue
        cells = []
        for m in methods:
            rs = [(answer(k, m), by[k]["vanilla"]) for k in keys]
            rs = [(a, v) for a, v in rs if a is not None]
            if len(rs) < len(keys):
                cells.append("–" if not rs else f"n={len(rs)} only")
                continue
            right = sum(bool(a["correct"]) for a, _ in rs)
            b = sum(bool(a["correct"]) and not v["correct"] for a, v in rs)
            c = sum(v["correct"] and not bool(a["correct"]) for a, v in rs)
            t = totals[m]
            t[0] += right; t[1] += b; t[2] += c; t[3] += len(rs)
            cells.append(f"{100 * right / len(rs):.1f}" + ("" if m == "vanilla" else f" ({b}/{c})"))
        print(f"| {task} | {len(keys)} | " + " | ".join(cells) + " |")
    cells = [total_cell(*totals[m], complete=totals[m][3] == len(samples), baseline=m == "vanilla") for m in methods]
    print(f"| **all** | {len(samples)} | " + " | ".join(cells) + " |")
    print()
    print("| method | Δ gold log-prob vs vanilla (mean, nats; pairs) | same answer text as vanilla | wall time per answer (mean s) | prefill (mean s) | decode (mean s) |")
    print("|---|---|---|---|---|---|")
    for m in ["vanilla", *BASELINES]:
        rs = [(by[k][m], by[k]["vanilla"]) for k in samples]
        d = [a["logprob_gold"] - v["logprob_gold"] for a, v in rs if a.get("logprob_gold") is not None and v.get("logprob_gold") is not None]
        same = sum(a["answer"] == v["answer"] for a, v in rs)
        wall = statistics.mean(a["timings"]["wall_s"] for a, _ in rs)
        pre = statistics.mean(a["timings"]["prefill_s"] for a, _ in rs)
        dec = statistics.mean(a["timings"]["decode_s"] for a, _ in rs)
        lp = "–" if m == "vanilla" else (f"{statistics.mean(d):+.2f} ({len(d)})" if d else "–")
        print(f"| {m} | {lp} | {'–' if m == 'vanilla' else f'{same} of {len(rs)}'} | {wall:.1f} | {pre:.1f} | {dec:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
