"""Where QGPM's decode time goes: its own per-step work, or the state a pass 1 leaves.

    python benchmarks/decode_steps.py --lengths 4096,8000 --rounds 6 --out benchmarks/results/decode_steps_cpu_smollm2.md
    # a launch-bound step (Llama-3-8B's depth at 1/16 of its width), the default stride plan with its layer hooks:
    python benchmarks/decode_steps.py --random-arch llama3-8b-thin --tokenizer DIR --lengths 4096,8000 --rounds 6 --out ...

``benchmarks/speed.py`` reports a call's decode speed as tokens over decode time. This one
times every decode step (the gap between two consecutive calls of a logits processor: one
forward plus the sampling) and compares three calls on the same prompt, in the same run:

- **vanilla**: the plain call;
- **qgpm**: the QGPM call (pass 1, then pass 2 and decoding under its plan: layer hooks that
  hand each layer its remapped rotary rows where the plan needs them, none where pass 2 runs
  in slot order or falls back);
- **vanilla after pass 1**: the same engine runs QGPM's pass 1 and plan for the prompt
  (``QGPM.prepare``) and throws them away, then makes the plain call. Its decoding does the
  same work as vanilla's, from the process state a pass 1 leaves behind.

qgpm against "vanilla after pass 1" is the cost of QGPM's own decode work (its hooks);
"vanilla after pass 1" against vanilla is what the preceding pass 1 does to the state
(allocator, caches), which no change to the decode path can remove. Rounds alternate the
order (A B C, then C B A) so that drift cancels; each call's figure is the median of its
step times, and each ratio is taken within a round, then the median over rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (the sibling benchmark: same prompt builder and random architectures)

from qgpm import QGPM  # noqa: E402
from qgpm.sources import parse_source  # noqa: E402

CALLS = ("vanilla", "qgpm", "vanilla after pass 1")


class StepClock:
    """A logits processor that records when each generation step reaches sampling."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        return scores

    def step_ms(self) -> list[float]:
        """Decode step times (ms): from the first token's logits to the next, and so on."""
        return [(b - a) * 1e3 for a, b in zip(self.stamps, self.stamps[1:])]


def timed_call(engine: QGPM, context: str, method: str, new_tokens: int, prepare_first: QGPM | None = None) -> dict:
    """One call's per-step decode times (median and mean, ms) and how its pass 2 ran."""
    from transformers import LogitsProcessorList

    if speed.MALLOC_TRIM is not None:
        speed.MALLOC_TRIM(0)
    if prepare_first is not None:
        prepare_first.prepare(context, speed.QUESTION)  # pass 1 and the plan, thrown away
    clock = StepClock(engine.device.type == "cuda")
    res = engine.answer(context, speed.QUESTION, method=method, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        logits_processor=LogitsProcessorList([clock]))
    steps = clock.step_ms()
    if len(steps) < 2:
        raise RuntimeError(f"only {len(steps)} decode steps were timed; pass --new-tokens of at least 3")
    return {"median": statistics.median(steps), "mean": statistics.fmean(steps), "prompt_tokens": res.usage.prompt_tokens,
            "pass2": res.details.get("pass2")}


class _ProfileDecode:
    """A logits processor that starts ``profiler`` at the first token's logits, so that it
    records the decode steps only (not pass 1, the prefill or the table building)."""

    def __init__(self, profiler: cProfile.Profile) -> None:
        self.profiler = profiler
        self.started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.started:
            self.started = True
            self.profiler.enable()
        return scores


def hook_time(engine: QGPM, context: str, new_tokens: int) -> dict:
    """One QGPM call with its decode steps under cProfile: the time spent in the plan's layer
    hooks (:func:`qgpm.hooks.position_hooks`' ``hook``, with what it calls) per decode step (ms,
    cProfile's own overhead included, so an upper bound), and how many hook calls a step makes."""
    from transformers import LogitsProcessorList

    import qgpm.hooks

    profiler = cProfile.Profile()
    try:
        engine.answer(context, speed.QUESTION, method="qgpm", max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                      logits_processor=LogitsProcessorList([_ProfileDecode(profiler)]))
    finally:
        profiler.disable()
    where = qgpm.hooks.__file__
    cum, calls = 0.0, 0
    for (filename, _line, name), (_cc, ncalls, _tt, ct, _callers) in pstats.Stats(profiler).stats.items():
        if name == "hook" and filename == where:
            cum, calls = cum + ct, calls + ncalls
    steps = new_tokens - 1  # the forwards after the first token's logits
    return {"ms_per_step": cum * 1e3 / steps, "calls_per_step": calls / steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--random-arch", choices=sorted(speed.RANDOM_ARCHS), default=None, help="time a random-weight model of this shape")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for --random-arch")
    ap.add_argument("--lengths", default="4096,8000")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--evidence-depth", type=float, default=0.5)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a QGPMConfig field for the QGPM calls (repeatable)")
    ap.add_argument("--profile-hooks", action="store_true",
                    help="also run one QGPM call per length with its decode steps under cProfile and report the time in the "
                         "plan's layer hooks per step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    speed.check_model_args(ap, args)
    sets = speed.config_sets(ap, args.set)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (rounds alternate the order of the calls)")
    if args.new_tokens < 3:
        ap.error("--new-tokens must be at least 3 (two timed decode steps)")
    if not 0.0 <= args.evidence_depth <= 1.0:
        ap.error("--evidence-depth must be in [0, 1]")
    if args.random_arch:
        engine = speed.random_engine(args.random_arch, args.tokenizer, args.device, args.dtype, None)
    else:
        engine = QGPM.from_pretrained(args.model, device_map=args.device, dtype=args.dtype)
    # every QGPM call runs the remapped pass 2 (as in speed.py): the confidence rules off
    config = engine.config.with_(min_top_z=None, decisive_margin=None, **sets)
    qgpm = QGPM(engine.model, engine.tokenizer, heads=engine.heads, config=config, name=engine.name)
    run = {
        "vanilla": lambda ctx: timed_call(engine, ctx, "vanilla", args.new_tokens),
        "qgpm": lambda ctx: timed_call(qgpm, ctx, "qgpm", args.new_tokens),
        "vanilla after pass 1": lambda ctx: timed_call(engine, ctx, "vanilla", args.new_tokens, prepare_first=qgpm),
    }
    text = speed.long_text()
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        ctx = speed.context_with_evidence_at(engine, text, length - args.new_tokens, args.evidence_depth)
        timed_call(engine, ctx, "vanilla", 4)  # warm-up at this length
        got: dict[str, list[dict]] = {c: [] for c in CALLS}
        for r in range(args.rounds):
            for c in (CALLS if r % 2 == 0 else CALLS[::-1]):
                got[c].append(run[c](ctx))
        rows.append((length, got, hook_time(qgpm, ctx, args.new_tokens) if args.profile_hooks else None))
        print(length, {c: [round(x["median"], 2) for x in v] for c, v in got.items()}, flush=True)

    def ratio(got, num: str, den: str) -> str:
        per_round = [a["median"] / b["median"] for a, b in zip(got[num], got[den])]
        return f"{statistics.median(per_round):.3f} ({min(per_round):.3f}-{max(per_round):.3f})"

    dev = engine.device.type + (f" ({torch.cuda.get_device_name()})" if engine.device.type == "cuda" else f" ({torch.get_num_threads()} torch threads)")
    pass2 = sorted({x["pass2"] for _, got, _ in rows for x in got["qgpm"]} - {None})
    ranking = (f"pass 1 {speed.precision_note(qgpm)}" if parse_source(config.relevance).heads else
               f"no pass 1 over the model: the {config.relevance} reranker ranks the sentences (\"pass 1\" below is that ranking)")
    lines = [
        f"# Decode step times: QGPM's own work vs the state after pass 1 ({engine.name}"
        f"{' (random weights: timing only)' if args.random_arch else ''}, {dev}, dtype {next(engine.model.parameters()).dtype})",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"{args.rounds} rounds per length (order A B C, then C B A), {args.new_tokens} new tokens per call, evidence at depth "
        f"{args.evidence_depth:g}. QGPM settings: the engine's (relevance={config.relevance}, remap={config.remap}, split_layer={config.split_layer}"
        f"{''.join(', --set ' + kv for kv in args.set)}) with the confidence rules off; {ranking}; "
        f"how its pass 2 ran: {', '.join(pass2)}. "
        f"Python {platform.python_version()}, torch {torch.__version__}.",
        "",
        "Step: the time between two consecutive decode steps' logits (one forward plus sampling); each call's figure is the "
        "median of its steps, and the table gives the median over rounds. Ratios are of step times, taken within a round "
        "(median over rounds, lowest-highest in brackets; above 1 = the first call steps slower): **hooks** = qgpm / vanilla after pass 1 (QGPM's own decode work), "
        "**state** = vanilla after pass 1 / vanilla (what a preceding pass 1 leaves), **all** = qgpm / vanilla.",
        "",
        "| prompt tokens | vanilla (ms/step) | qgpm (ms/step) | vanilla after pass 1 (ms/step) | hooks | state | all | decode ratio (vanilla / qgpm) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length, got, _ in rows:
        med = {c: statistics.median(x["median"] for x in got[c]) for c in CALLS}
        all_rounds = [b["median"] / a["median"] for a, b in zip(got["qgpm"], got["vanilla"])]
        lines.append(
            f"| {got['vanilla'][0]['prompt_tokens']} | {med['vanilla']:.2f} | {med['qgpm']:.2f} | {med['vanilla after pass 1']:.2f} | "
            f"{ratio(got, 'qgpm', 'vanilla after pass 1')} | {ratio(got, 'vanilla after pass 1', 'vanilla')} | {ratio(got, 'qgpm', 'vanilla')} | "
            f"{statistics.median(all_rounds):.2f} |"
        )
    if args.profile_hooks:
        lines += [
            "",
            "**Hook time per decode step** (one more QGPM call per length, its decode steps under cProfile: the cumulative "
            "time of the plan's layer hooks, `qgpm.hooks.position_hooks`, over the forwards after the first token; cProfile's "
            "own overhead included, so an upper bound; 0 where pass 2 runs without a plan).",
            "",
            "| prompt tokens | hook calls per step | hook time per step (ms) | share of the qgpm step |",
            "|---:|---:|---:|---:|",
        ]
        for length, got, hooks in rows:
            step = statistics.median(x["median"] for x in got["qgpm"])
            lines.append(f"| {got['vanilla'][0]['prompt_tokens']} | {hooks['calls_per_step']:.0f} | {hooks['ms_per_step']:.3f} | "
                         f"{hooks['ms_per_step'] / step:.2%} |")
    speed.emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
