"""One test grid as a table: per task, each series' right answers with wins / losses against a
base series and the exact McNemar p, on the samples every series ran; the mean seconds per
answer from the rows' timings; and, for models prompted as plain text, how many right answers
hold the gold only after the answer's first line, and per task how many answers are empty
(nothing, or only an ``Answer:`` prefix the model wrote itself) and how many of the others are right.

    python benchmarks/grid_table.py benchmarks/results/eval_gemma3_270m_test/rows.jsonl --length 2048 \\
        --series vanilla=HASH,qgpm=HASH,oracle=HASH,reorder=HASH,topk=HASH --against reorder

The seconds are the rows' ``timings.wall_s`` (preparation, pass 1, prefill and decoding of one
answer in a one-thread process, two such processes sharing the machine): a cost per answer as
the grid ran, not a timing benchmark.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

from qgpm.eval.scoring import is_correct
from qgpm.eval.significance import mcnemar_exact


def parse_series(spec: str) -> dict[str, str]:
    """``"label=config_hash,..."`` -> ``{label: config_hash}`` in the given order."""
    return dict(item.split("=", 1) for item in spec.split(",") if item)


def parse_range(text: str, flag: str) -> tuple[int, int]:
    """``"LO-HI"`` (both included) as ``(LO, HI)``; ``flag`` names the option in the error."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise SystemExit(f"{flag} takes LO-HI (two integers, e.g. 0-11), got {text!r}") from None
    if lo > hi:
        raise SystemExit(f"{flag} {text}: LO must not exceed HI")
    return lo, hi


def load_rows(paths: list[Path], series: dict[str, str], length: int, task: str | None = None) -> dict[str, dict[tuple, dict]]:
    """label -> {(task, depth, seed, index): row} for the answered rows of each labelled series at
    ``length`` tokens (only ``task``'s rows when given)."""
    rows: dict[str, dict[tuple, dict]] = collections.defaultdict(dict)
    hashes: dict[str, set[str]] = collections.defaultdict(set)
    for p in paths:
        for line in p.read_text().splitlines():
            r = json.loads(line)
            labels = [m for m, h in series.items() if h and r["config_hash"].startswith(h)]  # a hash or a prefix (report.md prints 6 characters)
            for label in labels:
                hashes[label].add(r["config_hash"])
            if labels and r["length"] == length and r.get("answer") is not None and task in (None, r["task"]):
                for label in labels:
                    rows[label][(r["task"], r["depth"], r["seed"], r["index"])] = r
    many = {label: sorted(h) for label, h in hashes.items() if len(h) > 1}
    if many or any(not h for h in series.values()):
        raise SystemExit(f"--series: give each label a hash prefix of exactly one series; {many or 'an empty one'} matches several")
    return rows


def wins_losses(a: dict[tuple, dict], b: dict[tuple, dict], keys) -> tuple[int, int]:
    """Samples among ``keys`` that ``a`` answers right and ``b`` wrong, and the other way round."""
    w = sum(bool(a[k]["correct"]) and not b[k]["correct"] for k in keys)
    l_ = sum(bool(b[k]["correct"]) and not a[k]["correct"] for k in keys)
    return w, l_


def grid_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments of a table over one grid length: rows files, ``--length``, ``--series``, ``--against``."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", type=Path)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--series", required=True, help="label=config_hash,... (the first label is the base)")
    ap.add_argument("--against", default=None, help="a second label every series is also paired against")
    return ap


def main(argv=None) -> int:
    args = grid_parser(__doc__).parse_args(argv)
    series = parse_series(args.series)
    rows = load_rows(args.rows, series, args.length)
    labels = list(series)
    missing = [m for m in labels if not rows.get(m)]
    if missing:
        raise SystemExit(f"no rows at {args.length} tokens for {missing}")
    base, other = labels[0], args.against
    common = set.intersection(*(set(rows[m]) for m in labels))
    tasks = sorted({k[0] for k in common})

    def pair(m: str, ref: str, keys: list) -> str:
        w, l_ = wins_losses(rows[m], rows[ref], keys)
        return f"{w}/{l_}, {mcnemar_exact(w, l_):.2g}"

    head = "| task | n | " + " | ".join(labels) + " |"
    print(f"{len(common)} samples every series ran, {args.length} tokens. Cells: right (wins / losses, p against {base}"
          + (f"; then against {other}" if other else "") + ")\n")
    print(head)
    print("|---|---:|" + "---|" * len(labels))
    for task in tasks + ["all"]:
        keys = sorted(k for k in common if task in ("all", k[0]))
        cells = []
        for m in labels:
            right = sum(bool(rows[m][k]["correct"]) for k in keys)
            cell = str(right)
            if m != base:
                cell += f" ({pair(m, base, keys)}" + (f"; {pair(m, other, keys)}" if other and m != other else "") + ")"
            cells.append(cell)
        name = "**all**" if task == "all" else task
        print(f"| {name} | {len(keys)} | " + " | ".join(cells) + " |")
    keys = sorted(common)
    base_s = statistics.mean(rows[base][k]["timings"]["wall_s"] for k in keys)
    print("\n| series | mean seconds per answer | against " + base + " | right only after the first line |")
    print("|---|---:|---:|---:|")
    for m in labels:
        s = statistics.mean(rows[m][k]["timings"]["wall_s"] for k in keys)
        late = sum(bool(r["correct"]) and not is_correct(r["metric"], r["answer"].strip().split("\n")[0], r["gold"])
                   for r in (rows[m][k] for k in keys))
        print(f"| {m} | {s:.1f} | {s / base_s:.2f}x | {late} |")
    print("\nEmpty answers; right / answered among the others")
    print("\n| task | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for task in sorted({k[0] for k in common}):
        keys = sorted(k for k in common if k[0] == task)
        cells = []
        for m in labels:
            answered = [r for r in (rows[m][k] for k in keys) if not is_empty(r["answer"])]
            cells.append(f"{len(keys) - len(answered)}; {sum(bool(r['correct']) for r in answered)} / {len(answered)}")
        print(f"| {task} | " + " | ".join(cells) + " |")
    return 0


def is_empty(answer: str) -> bool:
    """True for an answer with nothing in it but, at most, an ``Answer:`` prefix."""
    text = answer.strip()
    return not text or text.rstrip(":").strip().lower() == "answer"


if __name__ == "__main__":
    raise SystemExit(main())
