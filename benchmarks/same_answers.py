"""Do a run's answers equal the committed ones? Row by row, on the same samples and series.

    python benchmarks/same_answers.py runs/slice30 benchmarks/results/eval_smollm2_test

Each row of the run folder (``rows*.jsonl``, deduplicated) is matched to the committed row
with the same task, length, depth, index, method and config hash; the answer texts are
compared. Prints the counts per series and every difference; exit code 1 when any answer
differs or a row has no committed match.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qgpm.eval.rows import dedupe_rows, read_rows  # noqa: E402


def key(row: dict) -> tuple:
    return row["task"], int(row["length"]), row["depth"], int(row["index"]), row["method"], row["config_hash"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a qgpm eval --out folder")
    ap.add_argument("committed", help="a committed results folder")
    args = ap.parse_args()
    committed = {key(r): r for r in read_rows(args.committed, include_ranks=False)}
    run = dedupe_rows(read_rows(args.run))
    counts: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    bad = 0
    for r in run:
        c = counts[(r["method"], r["config_hash"][:6])]
        old = committed.get(key(r))
        if old is None:
            c[2] += 1
            bad += 1
            print("no committed row:", key(r))
        elif old["answer"] == r["answer"]:
            c[0] += 1
        else:
            c[1] += 1
            bad += 1
            print("different:", key(r), repr(old["answer"][:80]), "->", repr(r["answer"][:80]))
    for (method, series), (same, diff, missing) in sorted(counts.items()):
        print(f"{method} {series}: {same} identical, {diff} different, {missing} without a committed row")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
