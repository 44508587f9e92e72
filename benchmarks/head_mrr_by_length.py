"""Do heads calibrated on short prompts hold on long ones? Evidence MRR of the shipped
head set by context length, on the test grid's samples (pass 1 only, no generation).

    python benchmarks/head_mrr_by_length.py --lengths 1024,2048 --n 3 \
        --out benchmarks/results/head_mrr_by_length.md

For each (task, length, depth, index) sample of the test split (the same seeds as the
test grid in ``benchmarks/results/eval_smollm2_test``), ``engine.prepare(method="qgpm")``
runs pass 1 with the shipped heads and the best rank of a sentence holding the evidence
is read off (``qgpm.eval.answering.evidence_rank``, the ``evidence_rank`` field of the
grid's rows). MRR = mean of 1 / (rank + 1); top-1 = share ranked first.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import torch

from qgpm.eval.answering import evidence_rank, prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.samples.base import split_seed
from qgpm.samples.tasks import generate

TASKS = ("niah_single_2", "niah_multikey_1", "niah_multivalue", "nolima_direct", "qa_1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--n", type=int, default=3, help="needle contents per (task, length, depth) (test indexes 0..n-1)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = [float(x) for x in args.depths.split(",")]
    tasks = args.tasks.split(",")
    engine = load_engine(args.model, device="cpu", dtype="float32")
    engine.config = engine.config.with_(relevance="heads")  # the heads' ranking, whatever source the model's preset uses
    ranks: dict[tuple[str, int], list[int | None]] = defaultdict(list)
    secs: dict[int, list[float]] = defaultdict(list)
    for length in lengths:
        for task in tasks:
            for d in depths:
                for i in range(args.n):
                    s = generate(task, n=1, length=length, tokenizer=engine.tokenizer, seed=split_seed("test", i), depths=[d], max_new_tokens=48)[0]
                    t = time.perf_counter()
                    call = engine.prepare(s.context, s.question, **prepare_kwargs(s, "qgpm"))
                    secs[length].append(time.perf_counter() - t)
                    ranks[(task, length)].append(evidence_rank(call, s))
                    print(task, length, d, i, ranks[(task, length)][-1], flush=True)

    def stats(rs):
        got = [r for r in rs if r is not None]
        mrr = sum(1 / (r + 1) for r in got) / len(rs) if rs else float("nan")
        return mrr, sum(r == 0 for r in got), len(rs), len(rs) - len(got)

    lines = [
        "# Evidence MRR of the shipped head set by context length (SmolLM2-135M-Instruct)",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"Test-split samples (indexes 0–{args.n - 1}, the test grid's seeds), depths {args.depths}; pass 1 only, "
        f"shipped head set ({len(engine.head_set.heads)} heads, calibrated at 1K–2K tokens). MRR counts a sentence holding the evidence "
        "(best rank); a sample whose evidence could not be located counts 0. torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s).",
        "",
        "| task | " + " | ".join(f"{L} tokens: MRR (top-1 / n)" for L in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for task in tasks + ["all"]:
        cells = []
        for L in lengths:
            rs = [r for (t, l), v in ranks.items() if l == L and (task == "all" or t == task) for r in v]
            mrr, top1, n, lost = stats(rs)
            cells.append(f"{mrr:.3f} ({top1} / {n})" + (f", {lost} not located" if lost else ""))
        lines.append(f"| {'**all**' if task == 'all' else task} | " + " | ".join(cells) + " |")
    lines += ["", "Mean pass-1 time per sample: " + ", ".join(f"{L} tokens {sum(secs[L]) / len(secs[L]):.2f} s" for L in lengths), ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
