"""QGPM's peak memory against vanilla, counted at the allocation level.

    python benchmarks/memory_alloc.py --lengths 1024,2048,4096,8000 --evidence-depth 0.5 --out benchmarks/results/memory_alloc_cpu_smollm2.md
    python benchmarks/memory_alloc.py --relevance minilm --out benchmarks/results/memory_alloc_cpu_smollm2_minilm.md

Peak RSS (``benchmarks/speed.py``) is too noisy on CPU: glibc keeps freed heap pages, and
vanilla's own 8K peak spread from 695 to 917 MiB across runs. Here every tensor allocation
and free made during a call is recorded by the torch profiler (``profile_memory=True``);
the peak is the largest running total of live tensor bytes above the total at the call's
start, so the model weights, and whatever the allocator keeps cached, do not enter it. The
count is deterministic for a given prompt: one call per method and length is enough.

Same prompt builder and settings as ``benchmarks/speed.py``: evidence at the given depth,
the engine's preset with the confidence rules off (every QGPM call runs the remapped
pass 2), prefill reuse on. The phase holding each peak comes from the call's own timings
laid end to end; the ranking's peak (pass 1 over the heads, or the reranker's forward with
``--relevance minilm`` and the like) per prompt token shows whether it grows linearly in N.
The QGPM engine answers one short call before counting, so a reranker's weights, loaded on
first use, are not counted as the call's memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (the sibling benchmark: same prompt builder)

from qgpm import QGPM  # noqa: E402
from qgpm.config_files import coerce_value  # noqa: E402
from qgpm.sources import parse_source  # noqa: E402

PHASES = ("edit", "pass 1", "plan", "prefill", "decode")


def counted_call(fn):
    """Run ``fn()`` under the profiler; return its result, the call's start time (ns, the
    profiler's clock) and the time-ordered ``[(t_ns, running live bytes)]`` after each
    allocation or free.

    The profiler's memory hook records the calling thread only; ``QGPM.answer`` runs pass 1,
    the prefill and decoding on the caller's thread (``QGPM.stream`` would not: it
    generates on a worker thread, so it is not what is counted here)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t0 = time.time_ns()
        res = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type().name == "CPU"]
    if not events:
        raise RuntimeError("the profiler recorded no CPU memory events; this torch build cannot count allocations")
    events.sort(key=lambda e: e.start_ns())
    live, trace = 0, []
    for e in events:
        live += e.nbytes()
        trace.append((e.start_ns(), live))
    return res, t0, trace


def phase_of(t_ns: int, t0: int, timings) -> str:
    """Which of the call's phases (its result timings laid end to end from ``t0``) holds ``t_ns``."""
    start = t0
    for name, secs in zip(PHASES, (timings.edit_s, timings.pass1_s, timings.plan_s, timings.prefill_s, timings.decode_s)):
        end = start + int(secs * 1e9)
        if t_ns < end:
            return name
        start = end
    return "after"


def peak(trace, lo: int | None = None, hi: int | None = None) -> tuple[int, int]:
    """``(peak live bytes, its time)`` over the trace points in ``[lo, hi)`` (whole trace by default)."""
    pts = [(t, b) for t, b in trace if (lo is None or t >= lo) and (hi is None or t < hi)]
    if not pts:
        return 0, 0
    t, b = max(pts, key=lambda p: p[1])
    return b, t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096,8000")
    ap.add_argument("--evidence-depth", type=float, default=0.5)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--heads", default=None, help="layer:head,... (default: the shipped set)")
    ap.add_argument("--pass1-dtype", default=None, choices=speed.PASS1_DTYPES, help="none | auto | bfloat16 | float16 | float32: the QGPM calls run pass 1 at this precision (QGPMConfig.pass1_dtype; "
                         "default: the preset's; none = the model's own dtype)")
    ap.add_argument("--relevance", default=None, help="QGPMConfig.relevance of the QGPM calls, e.g. heads or minilm (default: the preset's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.relevance:
        try:
            parse_source(args.relevance)  # a bad source stops here, before the model loads
        except ValueError as exc:
            ap.error(str(exc))
    lengths = [int(x) for x in args.lengths.split(",")]
    engine = QGPM.from_pretrained()
    heads = [tuple(int(x) for x in h.split(":")) for h in args.heads.split(",")] if args.heads else engine.heads
    extra = {"pass1_dtype": coerce_value(args.pass1_dtype)} if args.pass1_dtype else {}
    if args.relevance:
        extra["relevance"] = args.relevance
    cfg = engine.config.with_(min_top_z=None, decisive_margin=None, **extra)
    q = QGPM(engine.model, engine.tokenizer, heads=heads, config=cfg, name=engine.name)
    deepest = max(layer for layer, _ in heads)
    speed.measure(engine, speed.context_of(engine, speed.long_text(), 256), "vanilla", 2)  # warm-up
    # past keep_length, so the call ranks: a reranker source's model loads here, before any count
    speed.measure(q, speed.context_of(engine, speed.long_text(), int(cfg.keep_length) + 512), "qgpm", 2)
    ranking = "pass 1" if cfg.relevance == "heads" else f"the {cfg.relevance} reranker"
    text = speed.long_text()
    mib = 2**20
    rows = []
    for n in lengths:
        ctx = speed.context_with_evidence_at(engine, text, n - args.new_tokens, args.evidence_depth)
        got = {}
        for label, eng in (("vanilla", engine), ("qgpm", q)):
            res, t0, trace = counted_call(
                lambda: eng.answer(ctx, speed.QUESTION, method=label, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens))
            top, at = peak(trace)
            tm = res.timings
            p1_lo = t0 + int(tm.edit_s * 1e9)
            p1_top, _ = peak(trace, p1_lo, p1_lo + int(tm.pass1_s * 1e9)) if label == "qgpm" else (0, 0)
            got[label] = dict(tokens=res.usage.prompt_tokens, peak=top, phase=phase_of(at, t0, tm), pass1=p1_top,
                              end=trace[-1][1], reused=res.details.get("prefill_reused", 0), pass2=res.details.get("pass2"))
            print(label, n, got[label], flush=True)
        v, g = got["vanilla"], got["qgpm"]
        rows.append(f"| {v['tokens']} | {v['peak'] / mib:.1f} ({v['phase']}) | {g['peak'] / mib:.1f} ({g['phase']}) | "
                    f"{g['peak'] / v['peak']:.2f} | {g['pass1'] / mib:.1f} | {g['pass1'] / g['tokens'] / 1024:.1f} | "
                    f"{g['reused']} | {g['pass2']} |")
    lines = [
        f"# Peak tensor memory, QGPM against vanilla, counted per allocation ({engine.name}, cpu, dtype "
        f"{next(engine.model.parameters()).dtype})", "",
        f"Command: `python {' '.join(sys.argv)}`", "",
        "Every tensor allocation and free during one call, recorded by the torch profiler (`profile_memory=True`); peak = "
        "the largest running total of live tensor bytes above the total at the call's start (weights and allocator caches "
        f"excluded). Deterministic for a prompt, so one call per cell. Evidence at depth {args.evidence_depth:g}, "
        f"{args.new_tokens} new tokens, the engine's preset with the confidence rules off, relevance={cfg.relevance!r}: "
        + (f"pass 1 {speed.precision_note(q)}. Head set: {len(heads)} heads, deepest layer {deepest} of {engine.n_layers}. "
           if cfg.relevance == "heads" else f"the sentences ranked by {ranking} (no pass 1 over the model). ")
        + "The phase holding each peak is in brackets (the call's timings laid end to end; the ranking is the 'pass 1' phase). "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}.", "",
        f"| prompt tokens | peak vanilla (MiB) | peak qgpm (MiB) | mem ratio | ranking peak, {ranking} (MiB) | ranking peak per token (KiB) "
        "| prefill reused (tokens) | pass 2 |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
        *rows,
    ]
    speed.emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
