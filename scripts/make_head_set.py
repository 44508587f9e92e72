"""Make the shipped head set of a model by MRR calibration (paper App. A).

    python scripts/make_head_set.py --model smollm2 --n 36 --holdout 18 --top 8 \
        --out qgpm/data/heads/smollm2-135m-instruct.json

Calibration samples: ``qgpm.samples.tasks.calibration_samples`` (calibration split: seeds
2,000,000+ and needle keys disjoint from dev/test). The held-out batch (offset 1000 in
the same split) measures the chosen set's fused MRR next to random head sets.
"""

from __future__ import annotations

import argparse
import sys
import time

from qgpm import QGPM
from qgpm.defaults import DEFAULT_MODEL
from qgpm.calibrate import calibrate_heads
from qgpm.samples.tasks import calibration_samples


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model id, folder or .gguf (default: the embedded model)")
    ap.add_argument("--n", type=int, default=36)
    ap.add_argument("--holdout", type=int, default=18)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    engine = QGPM.from_pretrained(args.model, heads=[(0, 0)])
    t = time.time()
    cal = calibration_samples(engine.tokenizer, n=args.n, lengths=lengths)
    hold = calibration_samples(engine.tokenizer, n=args.holdout, lengths=lengths, offset=1000)
    hs = calibrate_heads(engine, cal, top=args.top, holdout=hold)
    hs.meta["command"] = "python " + " ".join(sys.argv)
    hs.meta["lengths"] = lengths
    hs.meta["seconds"] = round(time.time() - t, 1)
    hs.save(args.out)
    print(f"heads={hs.heads}\nmrr={[round(x, 3) for x in hs.mrr]}\nholdout fused MRR={hs.meta['holdout_fused_mrr']:.3f} "
          f"random {args.top}-head sets={hs.random_mrr:.3f} median single head={hs.meta['median_head_mrr']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
