"""Time each reranker per 1K context tokens (input-editing baselines, paper Sec. 5.3).

A deterministic ~2K-token text (counted with the SmolLM2 tokenizer) is split into
sentences and chunked at 128 tokens, exactly as ``qgpm.editing.edit_context`` does;
each reranker then scores all chunks against one question. Reported: the median
wall time of a full ``score`` call over ``--repeats`` runs (after one warm-up run,
model loading excluded and reported separately), and that time per 1K context tokens.

Usage::

    python benchmarks/rerank_timing.py [--tokens 2048] [--chunk-tokens 128] \\
        [--rerankers bm25,minilm,judge] [--repeats 5] [--out benchmarks/results/rerank_timing.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qgpm.editing import chunk_sentences  # noqa: E402
from qgpm.loading import default_model_source, load_tokenizer  # noqa: E402
from qgpm.rerank import get_reranker  # noqa: E402
from qgpm.segment import split_sentences  # noqa: E402

QUESTION = "Who calibrated the new tide gauge at the north pier?"
NEEDLE = "The new tide gauge at the north pier was calibrated by Ottilie Brandvold, a hydrographic engineer."

_SUBJECTS = ["The harbor master", "A ferry captain", "The port council", "The fishing cooperative", "A visiting inspector",
             "The maintenance crew", "The coast guard", "A local historian", "The weather office", "The dock workers"]
_VERBS = ["reported", "noted", "recorded", "announced", "reviewed", "questioned", "confirmed", "described", "measured", "planned"]
_OBJECTS = ["the repairs to the eastern breakwater", "the new mooring fees for visiting yachts", "the delay in the dredging schedule",
            "a rise in winter storm damage", "the installation of solar lights on the quay", "the count of seabirds on the rocks",
            "the cost of the ferry refit", "the cleaning of the slipway", "a shortage of crane operators", "the opening hours of the fish market"]
_TAILS = ["during the spring meeting", "after a long debate", "in the quarterly bulletin", "without further comment",
          "to the surprise of many residents", "for the second year in a row", "ahead of the summer season", "in a short statement"]


def make_text(tokenizer, target_tokens: int, seed: int = 0) -> str:
    """Deterministic filler sentences around one needle, about ``target_tokens`` tokens long."""
    rng = random.Random(seed)
    sentences: list[str] = []
    while True:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
        sentences.append(s)
        text = " ".join(sentences)
        if len(tokenizer.encode(text, add_special_tokens=False)) >= target_tokens:
            break
    sentences.insert(len(sentences) * 2 // 3, NEEDLE)
    return " ".join(sentences)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="approximate context length in SmolLM2 tokens")
    ap.add_argument("--chunk-tokens", type=int, default=128)
    ap.add_argument("--rerankers", default="bm25,minilm,judge", help="comma-separated get_reranker specs")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rerank_timing.md"))
    args = ap.parse_args()

    import torch

    load_start = os.getloadavg()[0]
    tok = load_tokenizer(default_model_source())
    count = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    text = make_text(tok, args.tokens)
    n_tokens = count(text)
    chunks = chunk_sentences(text, split_sentences(text), chunk_tokens=args.chunk_tokens, count_tokens=count)
    passages = [c.text for c in chunks]
    gold = next(i for i, c in enumerate(chunks) if "Brandvold" in c.text)

    rows = []
    for spec in [s.strip() for s in args.rerankers.split(",") if s.strip()]:
        t0 = time.perf_counter()
        r = get_reranker(spec)
        if hasattr(r, "load"):
            r.load()
        scores = r.score(QUESTION, passages)  # warm-up (also finishes lazy initialisation)
        load_s = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            scores = r.score(QUESTION, passages)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        med = statistics.median(times)
        med_cpu = statistics.median(cpu)
        rank = sorted(range(len(scores)), key=lambda i: (-scores[i], i)).index(gold) + 1
        rows.append((r.name, load_s, med, 1000.0 * med / n_tokens, 1000.0 * med_cpu / n_tokens, rank))
        print(f"{r.name}: median {med * 1000:.1f} ms per call, {1000 * med / n_tokens * 1000:.1f} ms / 1K tokens, gold rank {rank}", flush=True)

    cmd = shlex.join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    lines = [
        "# Reranker timing (input-editing baselines)",
        "",
        f"Command: `{cmd}`",
        "",
        f"- Date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}",
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), device: {'cuda' if torch.cuda.is_available() else 'cpu'}",
        f"- Load average at start / end (1 min): {load_start:.2f} / {os.getloadavg()[0]:.2f} "
        "(the machine is shared; a load well above the core count inflates every time below)",
        f"- Context: {n_tokens} SmolLM2 tokens, {len(chunks)} chunks at <= {args.chunk_tokens} tokens; "
        f"one question; gold chunk = the one holding the needle sentence",
        f"- Time = median of {args.repeats} full `score` calls over all chunks after one warm-up call; "
        "load = first construction + warm-up call; CPU time = process time (all threads)",
        "",
        "| reranker | load + warm-up (s) | wall time per call (ms) | wall time per 1K context tokens (ms) "
        "| CPU time per 1K context tokens (ms) | gold chunk rank |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, load_s, med, per_tok, per_tok_cpu, rank in rows:
        lines.append(
            f"| {name} | {load_s:.2f} | {med * 1000:.1f} | {per_tok * 1000:.1f} | {per_tok_cpu * 1000:.1f} | {rank} / {len(chunks)} |"
        )
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
