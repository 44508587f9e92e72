"""Shallow head sets: the shipped set against the best sets restricted to
lower layers, by held-out fused evidence MRR, with the pass-1 cost bound of each.

    OMP_NUM_THREADS=1 python benchmarks/shallow_heads.py --out benchmarks/results/shallow_heads.md

The per-head calibration MRRs are the ones stored in the shipped head set (36 calibration
samples, ``meta["per_head_mrr"]``); the held-out batch is the one the shipped set was
checked on (calibration split, offset 1000, 18 samples at 1K/2K tokens), so every set is
compared on the same samples. Pass 1 runs the model up to the deepest selected layer, so
its cost relative to a full prefill is (deepest layer + 1) / n_layers, and QGPM's
time-to-first-token bound is 1 + that.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from qgpm import QGPM
from qgpm.calibrate import HeadScores, fused_mrr, sample_head_logits
from qgpm.samples import calibration_samples


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--holdout", type=int, default=18)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--bounds", default="10,15,18,20", help="layer bounds to compare (heads in layers < bound)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    engine = QGPM.from_pretrained()
    hs = engine.head_set
    scores = HeadScores(torch.tensor(hs.meta["per_head_mrr"]), hs.samples)
    n_layers, n_heads = engine.n_layers, engine.model.config.num_attention_heads
    lengths = hs.meta.get("lengths", [1024, 2048])
    t = time.time()
    hold = calibration_samples(engine.tokenizer, n=args.holdout, lengths=lengths, offset=1000)
    every = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    per_sample = sample_head_logits(engine, hold, every)
    secs = time.time() - t
    sets = [("shipped (unrestricted)", [tuple(h) for h in hs.heads])]
    sets += [(f"layers < {b}", scores.best(args.top, max_layer=b)) for b in (int(x) for x in args.bounds.split(","))]
    lines = [
        f"# Shallow head sets for {engine.name}",
        "",
        f"Command: `OMP_NUM_THREADS=1 python {' '.join(sys.argv)}` ({secs:.0f} s for the held-out pass over all heads).",
        f"Held-out: {len(hold)} calibration-split samples (offset 1000, lengths {lengths}); per-head MRR from the shipped",
        f"head set's calibration ({hs.samples} samples). Pass-1 share = (deepest layer + 1) / {n_layers}; TTFT bound = 1 + share.",
        "",
        "| set | heads (layer, head) | mean per-head calibration MRR | held-out fused MRR | deepest layer | pass-1 share | TTFT bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, heads in sets:
        rows = [every.index(tuple(h)) for h in heads]
        mrr = fused_mrr(per_sample, rows)
        per_head = sum(float(scores.mrr[l, h]) for l, h in heads) / len(heads)
        deepest = max(l for l, _ in heads)
        share = (deepest + 1) / n_layers
        lines.append(f"| {name} | {' '.join(f'({l},{h})' for l, h in heads)} | {per_head:.3f} | {mrr:.3f} | {deepest} | {share:.2f} | {1 + share:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
