"""How good is QGPM's head relevance next to external rerankers? (paper RQ3)

    python benchmarks/rerank_mrr.py --n 24 --out benchmarks/results/rerank_mrr.md

On synthetic samples of the calibration tasks (a held-out batch of the calibration split,
offset 5000: never used to pick heads, never an evaluation sample), each context is cut
into the same sentence-aligned chunks the Top-K / Reorder baselines use (128 tokens).
The gold chunk is the one holding the evidence. Reported: MRR of the gold chunk under
each reranker, and under QGPM's head signal (chunk score = max fused z of its
sentences, from the shipped head set), plus the MRR of the evidence *sentence* under
the head signal, and seconds per 1K context tokens for each scorer.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from qgpm import QGPM
from qgpm.calibrate import evidence_sentences
from qgpm.editing import chunk_sentences
from qgpm.heads import reciprocal_rank
from qgpm.relevance import head_token_logits, sentence_logits
from qgpm.rerank import get_reranker
from qgpm.samples.tasks import calibration_samples
from qgpm.shaping import fuse_heads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--rerankers", default="bm25,minilm,judge")
    ap.add_argument("--chunk-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    engine = QGPM.from_pretrained()
    tok = engine.tokenizer
    samples = calibration_samples(tok, n=args.n, lengths=[int(x) for x in args.lengths.split(",")], offset=5000)
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    names = ["qgpm-heads", *args.rerankers.split(",")]
    rr: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    secs: dict[str, float] = defaultdict(float)
    sent_rr: dict[str, list[float]] = defaultdict(list)
    ctx_tokens = 0
    rerankers = {n: get_reranker(n) for n in names[1:]}
    for s in samples:
        call = engine.prepare(s.context, s.question, method="vanilla", instruction=s.instruction, template=s.template, answer_prefix=s.answer_prefix)
        p = call.prompt
        chunks = chunk_sentences(p.context_text, p.sentences, chunk_tokens=args.chunk_tokens, count_tokens=count)
        gold_sents = set(evidence_sentences(p, s.evidence))
        gold_chunks = [c.index for c in chunks if any(
            p.sentences[i].start < c.end and p.sentences[i].end > c.start for i in gold_sents)]
        ctx_tokens += p.context_tokens
        t = time.perf_counter()
        tl = head_token_logits(engine.model, p.input_ids, engine.heads, p.query_rows)
        z = fuse_heads(sentence_logits(tl, p.token_sentence, len(p.sentences), p.newline_tokens))
        secs["qgpm-heads"] += time.perf_counter() - t
        sent_rr[s.task].append(reciprocal_rank(z, sorted(gold_sents)))
        chunk_z = torch.tensor([max(float(z[i]) for i in range(len(p.sentences))
                                    if p.sentences[i].start >= c.start and p.sentences[i].start < c.end) for c in chunks])
        rr["qgpm-heads"][s.task].append(reciprocal_rank(chunk_z, gold_chunks))
        for name, r in rerankers.items():
            t = time.perf_counter()
            sc = r.score(s.question, [c.text for c in chunks])
            secs[name] += time.perf_counter() - t
            rr[name][s.task].append(reciprocal_rank(torch.tensor(sc), gold_chunks))
    tasks = sorted({s.task for s in samples})
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    lines = [
        "# Evidence-chunk MRR: QGPM head signal vs rerankers (SmolLM2-135M-Instruct)",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"{len(samples)} samples (calibration split, held-out offset 5000), lengths {args.lengths}, chunks of "
        f"{args.chunk_tokens} tokens; {ctx_tokens} context tokens in all. `qgpm-heads` = shipped head set "
        f"({len(engine.heads)} heads), chunk score = max fused z of its sentences. `judge` = SmolLM2 as a "
        "Qwen3-Reranker-format yes/no judge.",
        "",
        "| scorer | " + " | ".join(tasks) + " | all | s per 1K context tokens |",
        "|---|" + "---:|" * (len(tasks) + 2),
    ]
    for name in names:
        allv = [v for t in tasks for v in rr[name][t]]
        lines.append(f"| {name} | " + " | ".join(f"{mean(rr[name][t]):.3f}" for t in tasks)
                     + f" | **{mean(allv):.3f}** | {secs[name] / ctx_tokens * 1000:.3f} |")
    allsent = [v for t in tasks for v in sent_rr[t]]
    lines += ["", "Evidence-*sentence* MRR under the head signal (what QGPM actually ranks): "
              + ", ".join(f"{t} {mean(sent_rr[t]):.3f}" for t in tasks) + f"; all {mean(allsent):.3f}.",
              "", "Samples per task: " + ", ".join(f"{t} {len(rr['qgpm-heads'][t])}" for t in tasks) + "."]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
