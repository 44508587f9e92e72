"""A new series of the shipped preset (the shallow head set, layers < 18, rows of 2026-12-03;
pass 1 at bfloat16, ``pass1_dtype="auto"``, rows of 2026-12-04) against the preset as the
README counted it before, on a test grid, from the committed rows.

    python benchmarks/head_set_test_table.py
    python benchmarks/head_set_test_table.py --series db023b635d23 --length 4096
    python benchmarks/head_set_test_table.py --series 921a8e --label "bfloat16 pass 1" --length 2048
    python benchmarks/head_set_test_table.py --rows benchmarks/results/eval_smollm2_test_8k/rows.jsonl --length 8192 --series ...

``--series``: the config hash (or a prefix) of the new rows. The earlier answer per
sample is the one the README counted before the switch: the newest preset series that ran
on the sample (``a23b32``, else ``dc58f6``, else ``7cefc6``: each later series re-ran only
the samples its change could touch), and vanilla's answer where none ran (the flat-relevance
rule kept vanilla positions there). Vanilla, Top-K, Reorder and the Oracle (``cf83ac``,
reorder) are the committed rows of the same samples; a cell shows "–" when a method has no
row for some of the task's samples.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

from qgpm.eval.significance import mcnemar_exact

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baselines_table import total_cell  # noqa: E402  (the sibling table: same totals-row cells)

ROWS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "eval_smollm2_test" / "rows.jsonl"
EARLIER_SERIES = ("a23b32", "dc58f6", "7cefc6")  # newest first
ORACLE_SERIES = "cf83ac"
TASKS = ("niah_multikey_1", "niah_multivalue", "niah_single_2", "nolima_direct", "qa_1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=str(ROWS))
    ap.add_argument("--series", default="db023b635d23", help="config hash (prefix) of the shallow head set's rows")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--label", default="shallow set", help="what the new series changes, for the column names")
    args = ap.parse_args(argv)

    by: dict[tuple, dict] = collections.defaultdict(dict)  # (task, depth, index) -> label -> row
    for line in Path(args.rows).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["length"] != args.length or r.get("error"):
            continue
        key, m, h = (r["task"], r["depth"], r["index"]), r["method"], r["config_hash"]
        if m == "qgpm":
            if h.startswith(args.series):
                by[key]["new"] = r
            elif h[:6] in EARLIER_SERIES:
                old = by[key].get("earlier")
                if old is None or EARLIER_SERIES.index(h[:6]) < EARLIER_SERIES.index(old["config_hash"][:6]):
                    by[key]["earlier"] = r
        elif m == "oracle":
            if h.startswith(ORACLE_SERIES):
                by[key]["oracle"] = r
        elif m in ("vanilla", "topk", "reorder"):
            by[key][m] = r
    samples = sorted(k for k, ms in by.items() if "new" in ms and "vanilla" in ms)
    if not samples:
        raise SystemExit(f"no {args.length}-token sample has rows of series {args.series} and vanilla")
    for k in samples:
        by[k].setdefault("earlier", by[k]["vanilla"])  # no earlier-series row: vanilla positions, vanilla's answer

    cols = ["vanilla", "new", "earlier", "topk", "reorder", "oracle"]
    label = {"new": f"QGPM, {args.label}", "earlier": "QGPM, earlier", "topk": "Top-K", "reorder": "Reorder", "oracle": "Oracle"}
    print(f"{len(samples)} samples at {args.length} tokens with series {args.series} rows; cells: % right (wins/losses vs vanilla)")
    print()
    print("| task | n | " + " | ".join(label.get(c, c) for c in cols) + f" | {args.label} only / earlier only |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    tot = {c: [0, 0, 0, 0] for c in cols}
    incomplete: set[str] = set()  # methods without a row on some sample: no total
    pair = [0, 0]
    order = TASKS + tuple(sorted({k[0] for k in samples} - set(TASKS)))
    for task in order:
        keys = [k for k in samples if k[0] == task]
        if not keys:
            continue
        cells = []
        for c in cols:
            rs = [(by[k].get(c), by[k]["vanilla"]) for k in keys]
            if any(a is None for a, _ in rs):
                cells.append("–")
                incomplete.add(c)
                continue
            right = sum(bool(a["correct"]) for a, _ in rs)
            b = sum(bool(a["correct"]) and not v["correct"] for a, v in rs)
            w = sum(bool(v["correct"]) and not a["correct"] for a, v in rs)
            t = tot[c]
            t[0] += right; t[1] += b; t[2] += w; t[3] += len(rs)
            cells.append(f"{100 * right / len(rs):.1f}" + ("" if c == "vanilla" else f" ({b}/{w})"))
        so = sum(bool(by[k]["new"]["correct"]) and not by[k]["earlier"]["correct"] for k in keys)
        eo = sum(bool(by[k]["earlier"]["correct"]) and not by[k]["new"]["correct"] for k in keys)
        pair[0] += so; pair[1] += eo
        print(f"| {task} | {len(keys)} | " + " | ".join(cells) + f" | {so}/{eo} |")
    cells = [total_cell(*tot[c], complete=c not in incomplete, baseline=c == "vanilla") for c in cols]
    print(f"| **all** | {len(samples)} | " + " | ".join(cells) + f" | {pair[0]}/{pair[1]} (p {mcnemar_exact(*pair):.2g}) |")
    print()

    def rank_stats(c: str) -> str:
        rr = [by[k][c].get("evidence_rank") for k in samples if by[k][c].get("method") == "qgpm"]
        rr = [x for x in rr if x is not None]
        if not rr:
            return "–"
        return f"{sum(x == 0 for x in rr)} of {len(rr)} first, MRR {sum(1 / (x + 1) for x in rr) / len(rr):.3f}"

    def time_stats(c: str) -> str:
        rs = [by[k][c] for k in samples if by[k][c].get("method") == "qgpm"]
        if not rs:
            return "–"
        ts = [r["timings"] for r in rs]
        return (f"{statistics.mean(t['wall_s'] for t in ts):.1f} / {statistics.mean(t['pass1_s'] for t in ts):.1f} / "
                f"{statistics.mean(t['prefill_s'] for t in ts):.1f} ({len(rs)} rows)")

    same = sum(by[k]["new"]["answer"] == by[k]["earlier"]["answer"] for k in samples)
    moved = sum(1 for k in samples if not by[k]["new"].get("flat_relevance") and float(by[k]["new"].get("s_low", 1.0)) < 1.0)
    print(f"Same answer text, {args.label} vs earlier: {same} of {len(samples)}. Calls of the new series that moved or compressed "
          f"something (s_low < 1, relevance not flat): {moved} of {len(samples)}.")
    print()
    print("| series | evidence sentence ranked by the heads (qgpm rows) | wall / pass 1 / prefill per answer (mean s) |")
    print("|---|---|---|")
    for c in ("new", "earlier"):
        print(f"| {label[c]} | {rank_stats(c)} | {time_stats(c)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
