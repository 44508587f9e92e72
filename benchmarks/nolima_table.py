"""NoLiMa direct-question (``nolima_direct``) rows read by needle content: each method's right
answers, by depth and by content, how many different answers it gives across a content's
depths, and wins / losses against a base method with the exact McNemar p.

    # the committed 4K test rows (contents 0-11, depths 0 / 0.25 / 0.5 / 0.75 / 1):
    python benchmarks/nolima_table.py benchmarks/results/eval_smollm2_test/rows.jsonl \
        --series vanilla=6cbe99679449,heads=921a8ecd9903,minilm=5b41b7289667,reorder=255ab11124e8,topk=afacc4e2ce2f,oracle=cf83ac075e0a
    # the dev rows of scripts/nolima_cause.sh (series as the run's manifest names them):
    python benchmarks/nolima_table.py benchmarks/results/tune_smollm2_dev_4k/nolima_cause/rows.jsonl --series ...

A sample is one (content, depth); ``index`` is the needle content. A method whose answer is
the same at every depth of a content answers that content, not five samples.

Each content index draws its (needle template, character name) on its own seed, so contents
repeat: ``--by-question`` says how many distinct needles and questions the contents hold, and
gives each method's right answers per question (a template asks one question) with the
sign-flip p of the wins / losses against the base clustered by question.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qgpm.eval.significance import content_sign_flip, mcnemar_exact
from qgpm.samples.nolima import NEEDLES, needle_combos

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_table import load_rows, parse_range, parse_series, wins_losses  # noqa: E402  (the sibling table: the same rows and pairs)

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def load(paths: list[Path], series: dict[str, str], length: int) -> dict[str, dict[tuple[int, float], dict]]:
    """method label -> {(content, depth): row} for the NoLiMa rows of each labelled series."""
    rows = load_rows(paths, series, length, task="nolima_direct")
    seeds: dict[int, set[int]] = {}
    for v in rows.values():
        for r in v.values():
            seeds.setdefault(int(r["index"]), set()).add(int(r["seed"]))
    mixed = sorted(i for i, s in seeds.items() if len(s) > 1)
    if mixed:  # the same index in two splits is two different contents
        raise SystemExit(f"content index {mixed[0]} comes with seeds {sorted(seeds[mixed[0]])}: rows of several splits; "
                         "pass the rows of one split")
    return {m: {(r["index"], float(r["depth"])): r for r in v.values()} for m, v in rows.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", type=Path)
    ap.add_argument("--series", required=True, help="label=config_hash,... (the first label is the base of the wins / losses)")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--base", default=None, help="label the others are paired against (default: the first)")
    ap.add_argument("--contents", default=None, help="only these needle contents, e.g. 0-5")
    ap.add_argument("--by-question", action="store_true", help="also group the contents by the needle's question (template)")
    args = ap.parse_args(argv)
    series = parse_series(args.series)
    rows = load(args.rows, series, args.length)
    if args.contents:
        lo, hi = parse_range(args.contents, "--contents")
        rows = {m: {k: r for k, r in v.items() if lo <= k[0] <= hi} for m, v in rows.items()}
    labels = [m for m in series if rows.get(m)]
    base = args.base or labels[0]
    common = set.intersection(*(set(rows[m]) for m in labels))
    contents = sorted({c for c, _ in common})
    print(f"{len(common)} samples every method ran ({len(contents)} contents x depths), {args.length} tokens\n")
    print("| method | right | by depth " + " / ".join(f"{d:g}" for d in DEPTHS) + f" | contents right at least once | answers per content | vs {base} (wins/losses, p) |")
    print("|---|---:|---|---:|---:|---|")
    for m in labels:
        rs = {k: rows[m][k] for k in common}
        right = sum(bool(r["correct"]) for r in rs.values())
        by_depth = [sum(bool(r["correct"]) for (c, d), r in rs.items() if d == dep) for dep in DEPTHS]
        any_right = sum(any(rs[(c, d)]["correct"] for d in DEPTHS if (c, d) in rs) for c in contents)
        distinct = sum(len({rs[(c, d)]["answer"] for d in DEPTHS if (c, d) in rs}) for c in contents) / len(contents)
        vs = "–"
        if m != base:
            b, c_ = wins_losses(rs, rows[base], common)
            vs = f"{b}/{c_}, {mcnemar_exact(b, c_):.2g}"
        print(f"| {m} | {right}/{len(rs)} | {' / '.join(map(str, by_depth))} | {any_right}/{len(contents)} | {distinct:.1f} | {vs} |")
    print("\nRight answers per needle content (of its depths):\n")
    print("| content | gold | " + " | ".join(labels) + " |")
    print("|---:|---|" + "---:|" * len(labels))
    for c in contents:
        gold = next(rows[labels[0]][(c, d)]["gold"][0] for d in DEPTHS if (c, d) in common)
        cells = [str(sum(bool(rows[m][(c, d)]["correct"]) for d in DEPTHS if (c, d) in common)) for m in labels]
        print(f"| {c} | {gold} | " + " | ".join(cells) + " |")
    if args.by_question:
        by_question(rows, labels, base, common)
    return 0


def by_question(rows: dict, labels: list[str], base: str, common: set) -> None:
    """How many distinct needles and questions the contents hold, and right answers per question."""
    seed_of = {c: rows[base][(c, d)]["seed"] for c, d in common}
    combo = {c: needle_combos(s)[0] for c, s in seed_of.items()}  # the harness makes one sample per seed: entry 0
    contents = sorted(combo)
    questions = sorted({t for t, _ in combo.values()})
    print(f"\n{len(contents)} contents hold {len(set(combo.values()))} distinct needles (template, name) and {len(questions)} "
          "distinct questions (templates)\n")
    print("| template | contents | question | " + " | ".join(labels) + " |")
    print("|---:|---|---|" + "---:|" * len(labels))
    for t in questions:
        cs = [c for c in contents if combo[c][0] == t]
        keys = [k for k in common if k[0] in cs]
        cells = [f"{sum(bool(rows[m][k]['correct']) for k in keys)}/{len(keys)}" for m in labels]
        print(f"| {t} | {', '.join(map(str, cs))} | {NEEDLES[t].direct} | " + " | ".join(cells) + " |")
    keys = sorted(common)
    for m in labels:
        if m == base:
            continue
        diffs = [float(bool(rows[m][k]["correct"])) - float(bool(rows[base][k]["correct"])) for k in keys]
        ahead = sum(1 for t in questions if sum(d for d, k in zip(diffs, keys) if combo[k[0]][0] == t) > 0)
        behind = sum(1 for t in questions if sum(d for d, k in zip(diffs, keys) if combo[k[0]][0] == t) < 0)
        p = content_sign_flip(diffs, [combo[k[0]][0] for k in keys])
        print(f"\n{m} against {base}: ahead on {ahead} questions, behind on {behind}; sign-flip p clustered by question {p:.2g}")


if __name__ == "__main__":
    raise SystemExit(main())
