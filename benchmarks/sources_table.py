"""QGPM's relevance sources side by side, from the committed test rows.

    python benchmarks/sources_table.py --length 4096
    python benchmarks/sources_table.py --length 2048
    python benchmarks/sources_table.py --results benchmarks/results/eval_gemma3_270m_test --length 2048 \
        --heads-series e7f6c744dc0b --others vanilla=9e4c99a5482b,reorder=2f38d2625027,oracle=adf70452851e

On the samples where every source ran (the shipped preset with ``relevance`` set to the
heads, MiniLM, BM25 and heads+BM25), per task: right answers of each source, of vanilla,
Reorder and the Oracle where they ran, and each source's wins / losses against the heads
and against vanilla with the exact McNemar p. The heads are ``--heads-series`` (default: the
SmolLM2 preset's series 921a8e); a source's series is the qgpm series whose configuration is
the heads series' with that ``relevance`` (read from the manifest).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from qgpm.config import QGPMConfig
from qgpm.eval.hashes import config_dict
from qgpm.eval.significance import mcnemar_exact

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "eval_smollm2_test"
SOURCES = ("heads", "minilm", "bm25", "heads+bm25")
OTHERS = {"vanilla": "6cbe99679449", "reorder": "255ab11124e8", "oracle": "cf83ac075e0a", "topk": "afacc4e2ce2f"}
HEADS_SERIES = "921a8ecd9903"
TASKS = ("niah_multikey_1", "niah_multivalue", "niah_single_2", "nolima_direct", "qa_1")


def source_series(manifest: dict, heads_series: str) -> dict[str, str]:
    """source -> config hash of the qgpm rows made with the heads series' settings and that ``relevance``."""
    configs = manifest.get("configs", {})
    if heads_series not in configs:
        raise SystemExit(f"series {heads_series} is not in the manifest")
    base = QGPMConfig(**configs[heads_series]["config"])
    out = {"heads": heads_series}
    for src in SOURCES[1:]:
        want = config_dict(base.with_(relevance=src))
        for h, fp in configs.items():
            if fp.get("method") == "qgpm" and fp.get("config") == want and fp.get("model") == configs[heads_series].get("model"):
                out[src] = h
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--heads-series", default=HEADS_SERIES, help="config hash of the heads' qgpm rows")
    ap.add_argument("--others", default=",".join(f"{m}={h}" for m, h in OTHERS.items()),
                    help="method=config_hash,... of the other methods' rows")
    args = ap.parse_args(argv)
    folder = Path(args.results)
    others = dict(item.split("=", 1) for item in args.others.split(",") if item)
    series = source_series(json.loads((folder / "manifest.json").read_text()), args.heads_series)
    missing = [s for s in SOURCES if s not in series]
    if missing:
        raise SystemExit(f"no rows of the preset with relevance={', '.join(missing)} in {folder}")
    label = {h: s for s, h in series.items()} | {h: m for m, h in others.items()}
    by: dict[tuple, dict[str, dict]] = collections.defaultdict(dict)
    for line in (folder / "rows.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        name = label.get(r["config_hash"])
        if name is None or r["length"] != args.length or r.get("error"):
            continue
        by[(r["task"], r["depth"], r["index"])][name] = r
    present = [s for s in SOURCES if any(s in ms for ms in by.values())]
    if "heads" not in present:
        raise SystemExit(f"no {args.length}-token rows of the heads series {args.heads_series}")
    samples = sorted(k for k, ms in by.items() if all(s in ms for s in present) and "vanilla" in ms)
    if not samples:
        raise SystemExit(f"no {args.length}-token sample has rows of {', '.join(present)} and vanilla")
    cols = ["vanilla", *present, *(m for m in others if m != "vanilla")]
    absent = [s for s in SOURCES if s not in present]
    print(f"{len(samples)} samples at {args.length} tokens with rows of {', '.join(present)} and vanilla (series: "
          + ", ".join(f"{s} {h[:6]}" for s, h in series.items()) + ")"
          + (f"; no rows at this length for {', '.join(absent)}" if absent else ""))
    print()
    print("| task | n | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))

    def cell(keys: list, m: str) -> str:
        have = [k for k in keys if m in by[k]]
        if not have:
            return "–"
        right = sum(by[k][m]["correct"] for k in have)
        text = f"{right}" + ("" if len(have) == len(keys) else f" of {len(have)}")
        if m in SOURCES[1:]:
            w = sum(by[k][m]["correct"] and not by[k]["heads"]["correct"] for k in have)
            lo = sum(by[k]["heads"]["correct"] and not by[k][m]["correct"] for k in have)
            text += f" ({w}/{lo})"
        return text

    for task in (*TASKS, "all"):
        keys = [k for k in samples if task == "all" or k[0] == task]
        if not keys:
            continue
        print(f"| {task} | {len(keys)} | " + " | ".join(cell(keys, m) for m in cols) + " |")
    print()
    print("(w/l): wins / losses against the heads on the same samples. Over all samples, against the heads and against vanilla:")
    print()
    for m in (*present, "reorder"):
        if not all(m in by[k] for k in samples):
            continue
        for ref in ("heads", "vanilla"):
            if m == ref:
                continue
            w = sum(by[k][m]["correct"] and not by[k][ref]["correct"] for k in samples)
            lo = sum(by[k][ref]["correct"] and not by[k][m]["correct"] for k in samples)
            print(f"- {m} against {ref}: {w} wins / {lo} losses, McNemar exact p = {mcnemar_exact(w, lo):.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
