"""Where QGPM's extra peak memory over vanilla falls in a call: the RSS
above the pre-call RSS, sampled every 2 ms through one vanilla call and one QGPM call on the
same prompt, split by the call's phases (QGPM: pass 1, plan, prefill; both: decode).

    python benchmarks/memory_timeline.py --length 8000 --evidence-depth 0.5 --out benchmarks/results/memory_timeline_8k.md

Same prompt and settings as ``benchmarks/speed.py`` (its context builder, the engine's
preset with the confidence rules off, heap trimmed before each call). One call per method:
a diagnosis of where the peak happens, not a benchmark figure.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (the sibling benchmark: same prompt builder and heap trim)

from qgpm import QGPM  # noqa: E402


def timeline(fn):
    """Run ``fn()``; return its result, the call's start time and ``[(t, rss_delta_mib)]``."""
    proc = psutil.Process()
    if speed.MALLOC_TRIM is not None:
        speed.MALLOC_TRIM(0)
    base = proc.memory_info().rss
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def run():
        while not stop.is_set():
            samples.append((time.perf_counter(), (proc.memory_info().rss - base) / 2**20))
            time.sleep(0.002)

    th = threading.Thread(target=run, daemon=True)
    t0 = time.perf_counter()
    th.start()
    res = fn()
    stop.set()
    th.join()
    return res, t0, samples


def phase_peaks(t0: float, samples, timings) -> list[tuple[str, float, float]]:
    """``(phase, seconds, peak MiB)`` for the phases of ``timings`` laid end to end from ``t0``."""
    phases = [("edit", timings.edit_s), ("pass 1", timings.pass1_s), ("plan", timings.plan_s),
              ("prefill", timings.prefill_s), ("decode", timings.decode_s)]
    out, start = [], t0
    for name, secs in phases:
        if secs <= 0:
            continue
        end = start + secs
        inside = [m for t, m in samples if start <= t < end]
        out.append((name, secs, max(inside) if inside else float("nan")))
        start = end
    rest = [m for t, m in samples if t >= start]
    if rest:
        out.append(("after", max(0.0, samples[-1][0] - start), max(rest)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=8000)
    ap.add_argument("--evidence-depth", type=float, default=0.5)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--heads", default=None, help="layer:head,... (default: the shipped set)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    engine = QGPM.from_pretrained()
    heads = [tuple(int(x) for x in h.split(":")) for h in args.heads.split(",")] if args.heads else engine.heads
    cfg = engine.config.with_(min_top_z=None, decisive_margin=None)
    q = QGPM(engine.model, engine.tokenizer, heads=heads, config=cfg, name=engine.name)
    ctx = speed.context_with_evidence_at(engine, speed.long_text(), args.length - args.new_tokens, args.evidence_depth)
    speed.measure(engine, ctx, "vanilla", 2)  # warm-up
    lines = [f"# Peak memory by phase of one call ({engine.name}, {args.length} tokens, evidence at depth {args.evidence_depth:g})", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "RSS above the pre-call RSS (heap trimmed before each call), sampled every 2 ms; phases laid end to end "
             "from the call's result timings. One call per method: a diagnosis, not a benchmark figure.", "",
             "| method | phase | seconds | peak in phase (MiB) |", "|---|---|---:|---:|"]
    for label, eng, method in (("vanilla", engine, "vanilla"), ("qgpm", q, "qgpm")):
        res, t0, samples = timeline(lambda: eng.answer(ctx, speed.QUESTION, method=method, max_new_tokens=args.new_tokens,
                                                       min_new_tokens=args.new_tokens))
        for name, secs, peak in phase_peaks(t0, samples, res.timings):
            lines.append(f"| {label} | {name} | {secs:.2f} | {peak:.0f} |")
        lines.append(f"| {label} | **whole call** ({res.usage.prompt_tokens} prompt tokens"
                     + (f", prefill reused {res.details.get('prefill_reused', 0)}" if method == "qgpm" else "")
                     + f") | {res.timings.total_s:.2f} | **{max(m for _, m in samples):.0f}** |")
    speed.emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
