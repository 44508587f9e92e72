"""The shipped preset against Reorder on a test grid, task by task, on the samples both ran:
right answers, wins / losses and the exact McNemar p, and whether QGPM's target against Reorder
holds (at least Reorder's count on every task, and at least Reorder + 5 over all tasks).

    python benchmarks/against_reorder.py                       # 4K, preset 5b41b7 vs Reorder 255ab1
    python benchmarks/against_reorder.py --length 2048
    python benchmarks/against_reorder.py --qgpm 921a8ecd9903   # the heads series
    python benchmarks/against_reorder.py --indices 0-11        # samples 0-11 of each task only
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

from qgpm.eval.significance import mcnemar_exact

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_table import load_rows, parse_range, wins_losses  # noqa: E402  (the sibling table: the same rows and pairs)

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "eval_smollm2_test" / "rows.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=Path, default=RESULTS)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--qgpm", default="5b41b7289667", help="config hash of the QGPM series")
    ap.add_argument("--reorder", default="255ab11124e8", help="config hash of the Reorder series")
    ap.add_argument("--margin", type=int, default=5, help="the overall lead the target asks for")
    ap.add_argument("--indices", default=None, help="only samples whose index (a task's content) is in LO-HI, e.g. 0-11")
    args = ap.parse_args(argv)
    lo, hi = parse_range(args.indices, "--indices") if args.indices else (0, math.inf)
    rows = load_rows([args.rows], {"qgpm": args.qgpm, "reorder": args.reorder}, args.length)
    q, o = rows["qgpm"], rows["reorder"]
    common = sorted(k for k in set(q) & set(o) if lo <= k[3] <= hi)
    if not common:
        ap.error(f"no sample at {args.length} tokens has rows of both series {args.qgpm} and {args.reorder}"
                 + (f" with an index in {args.indices}" if args.indices else ""))
    by_task = collections.defaultdict(list)
    for k in common:
        by_task[k[0]].append(k)
    print(f"| task | n | QGPM ({args.qgpm[:6]}) | Reorder ({args.reorder[:6]}) | QGPM wins / losses, p | QGPM >= Reorder |")
    print("|---|---:|---:|---:|---|---|")
    every = True
    for task, keys in sorted(by_task.items()):
        a, b = sum(bool(q[k]["correct"]) for k in keys), sum(bool(o[k]["correct"]) for k in keys)
        w, l_ = wins_losses(q, o, keys)
        every &= a >= b
        print(f"| {task} | {len(keys)} | {a} | {b} | {w}/{l_}, {mcnemar_exact(w, l_):.2g} | {'yes' if a >= b else 'no'} |")
    a, b = sum(bool(q[k]["correct"]) for k in common), sum(bool(o[k]["correct"]) for k in common)
    w, l_ = wins_losses(q, o, common)
    print(f"| **all** | {len(common)} | **{a}** | **{b}** | {w}/{l_}, {mcnemar_exact(w, l_):.2g} | {'yes' if a >= b else 'no'} |")
    scope = f"samples with index {args.indices}" if args.indices else "every sample both series ran"
    print(f"\ntarget, on {scope}: at least Reorder on every task: {'met' if every else 'not met'}; "
          f"at least Reorder + {args.margin} over all: {'met' if a >= b + args.margin else 'not met'} ({a} against {b} + {args.margin})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
