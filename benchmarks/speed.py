"""QGPM vs vanilla cost, measured in the same run: time to first token, decode speed, peak memory.

    python benchmarks/speed.py --lengths 1024,2048,4096 --repeats 3 --out benchmarks/results/speed_cpu.md
    python benchmarks/speed.py --device cuda --dtype bfloat16 --lengths 1024,2048,4096,8000 --out ...
    # timing only, random weights of a named architecture (no checkpoint needed):
    python benchmarks/speed.py --random-arch llama3-8b --tokenizer DIR --device cuda --dtype bfloat16 ...

Each (length, method) runs ``--repeats`` times, methods interleaved, and the median is
reported. Every call generates exactly ``--new-tokens`` tokens (min = max). Peak memory
is the peak RSS above the pre-call RSS on CPU (sampled every 2 ms) and
``torch.cuda.max_memory_allocated`` above the pre-call allocation on CUDA. On CPU with
glibc, the heap is trimmed (``malloc_trim(0)``, outside the timed call) before each call,
so that the pre-call RSS is live memory: without it, free heap pages kept from an earlier,
larger call absorb part of the next call's peak, and a method's figure depends on what ran
before it (measured 2026-12-03: vanilla 247 MiB in one run, 405 in another, at the
same 4K prompt). Expected
(DESIGN.md App. D): TTFT ratio ~ 1 + (deepest head layer + 1) / n_layers, decode ratio ~ 1.

Bound: a QGPM call that does not reuse pass 1 as its prefill pays pass 1 and then one full
prefill over the remapped prompt, so its TTFT ratio is bounded below by
``1 + pass 1 / vanilla TTFT`` measured in the same run (at the model's precision pass 1 runs
``deepest + 1`` of ``n_layers`` layers, hence the formula above; a bfloat16 pass 1 costs
less). The tables give that bound and ``ratio / bound`` beside each such ratio: how much
the rest of the call (plan, pass 2, first token) costs above a vanilla prefill.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import sys
import threading
import time
from importlib import resources
from pathlib import Path

import psutil
import torch

from qgpm import QGPM
from qgpm.config_files import coerce_value


def long_text() -> str:
    base = resources.files("qgpm") / "data" / "sample"
    parts = [(base / "harbor_report.md").read_text(encoding="utf-8")]
    corpus = Path(__file__).resolve().parents[1] / "cookbooks" / "data" / "corpus"
    parts += [p.read_text(encoding="utf-8") for p in sorted(corpus.glob("*.md"))]
    return "\n\n".join(parts)


def context_of(engine: QGPM, text: str, tokens: int) -> str:
    """The longest prefix of ``text`` (cut at a paragraph; the text repeats if too short) whose prompt fits ``tokens``."""
    from qgpm.prompt import PromptSpec, build_prompt

    def size(ctx: str) -> int:  # prompt length without the engine's window check
        return build_prompt(engine.tokenizer, PromptSpec(context=ctx, question=QUESTION)).num_tokens

    paras = text.split("\n\n")
    approx = len(engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    paras = paras * max(1, -(-tokens // approx) + 1)
    lo, hi = 1, len(paras)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size("\n\n".join(paras[:mid])) <= tokens else (lo, mid - 1)
    return "\n\n".join(paras[:lo])


QUESTION = "Who calibrated the new tide gauge at the north pier?"
EVIDENCE_MARK = "calibrated by Ottilie Brandvold"  # in the harbor report's paragraph that answers QUESTION


def context_with_evidence_at(engine: QGPM, text: str, tokens: int, depth: float) -> str:
    """Like :func:`context_of`, with the paragraph that answers ``QUESTION`` taken out and put
    back at ``depth`` (0 = first paragraph, 1 = last) of the context."""
    paras = text.split("\n\n")
    hit = [i for i, p in enumerate(paras) if EVIDENCE_MARK in p]
    if len(hit) != 1:
        raise SystemExit(f"the evidence paragraph ({EVIDENCE_MARK!r}) must occur once in the benchmark text, found {len(hit)}")
    evidence = paras.pop(hit[0])
    rest = context_of(engine, "\n\n".join(paras), tokens - len(engine.tokenizer(evidence, add_special_tokens=False)["input_ids"]) - 8).split("\n\n")
    at = round(depth * len(rest))
    return "\n\n".join(rest[:at] + [evidence] + rest[at:])


def _malloc_trim():
    """glibc's ``malloc_trim`` (returns free heap pages to the OS), or ``None`` off glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


MALLOC_TRIM = _malloc_trim()


def emit(lines: list[str], out: str | None) -> None:
    """Print a benchmark's markdown report and write it to ``out`` when given."""
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(report)


class PeakRSS:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        if MALLOC_TRIM is not None:
            MALLOC_TRIM(0)
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def delta_mib(self) -> float:
        return (self.peak - self.base) / 2**20


RANDOM_ARCHS = {
    # SmolLM2-135M-Instruct's own config (the embedded model), random weights.
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, rope_theta=100000.0, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=True),
    # Llama-3.1-8B's shape (llama3 RoPE scaling), random weights, SmolLM2's vocabulary.
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # Llama-3.1-8B's depth (32 layers), GQA ratio (4) and RoPE at 1/16 of its width: a decode step
    # costs little beyond launching the layers, as an eager decode on a large GPU does, so the
    # decode ratio here shows QGPM's per-step overhead (its layer hooks) on a CPU.
    "llama3-8b-thin": dict(hidden_size=256, intermediate_size=896, num_hidden_layers=32, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=32, max_position_embeddings=131072, rms_norm_eps=1e-5,
                           rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
def random_engine(arch: str, tokenizer_dir: str, device: str | None, dtype: str | None, heads: str | None) -> QGPM:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(vocab_size=len(tok), **RANDOM_ARCHS[arch])
    dt = getattr(torch, dtype) if dtype else torch.float32
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        model = LlamaForCausalLM(cfg).to(dt).eval()
    if heads:
        hs = [tuple(int(x) for x in h.split(":")) for h in heads.split(",")]
    else:
        from qgpm.heads import HeadSet
        from importlib import resources as _r

        ref = HeadSet.load(str(_r.files("qgpm") / "data" / "heads" / "smollm2-135m-instruct.json"))
        hs = [(min(cfg.num_hidden_layers - 1, round(l * cfg.num_hidden_layers / 30)), h % cfg.num_attention_heads) for l, h in ref.heads]
        hs = list(dict.fromkeys(hs))
    return QGPM(model, tok, heads=hs, name=f"random-{arch}")


def config_sets(ap: argparse.ArgumentParser, items: list[str]) -> dict:
    """The ``--set FIELD=VALUE`` options as QGPMConfig changes (values read with
    :func:`qgpm.config_files.coerce_value`); a malformed item or an unknown field stops the parser,
    before any model loads."""
    from dataclasses import fields

    from qgpm import QGPMConfig

    known = {f.name for f in fields(QGPMConfig)}
    out = {}
    for kv in items:
        key, sep, value = kv.partition("=")
        key = key.strip()
        if not sep or not key:
            ap.error(f"--set takes FIELD=VALUE, got {kv!r}")
        if key not in known:
            ap.error(f"--set: {key!r} is not a QGPMConfig field; fields: {', '.join(sorted(known))}")
        out[key] = coerce_value(value)
    return out


def check_model_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--random-arch`` and ``--model`` exclude each other; ``--tokenizer`` (and ``--heads``, where
    the benchmark has it) go with ``--random-arch`` only, which needs ``--tokenizer``."""
    if args.random_arch is None:
        for opt in ("tokenizer", "heads"):
            if getattr(args, opt, None) is not None:
                ap.error(f"--{opt} is for --random-arch only (a checkpoint brings its own)")
        return
    if args.model is not None:
        ap.error("--model and --random-arch exclude each other: time a checkpoint or a random-weight shape")
    if not args.tokenizer:
        ap.error("--random-arch needs --tokenizer (a saved tokenizer folder)")


PASS1_DTYPES = ("none", "auto", "bfloat16", "float16", "float32")
"""What the benchmarks' pass-1 precision options take: QGPMConfig.pass1_dtype values, ``none`` = the model's dtype
(read with :func:`qgpm.config_files.coerce_value`, as ``--set`` reads it)."""


def precision_note(engine: QGPM) -> str:
    """How ``engine``'s pass 1 runs on a call long enough to be remapped (its config's ``pass1_dtype``)."""
    low = engine.pass1_precision(context_tokens=None)
    want = engine.config.pass1_dtype
    if low is None:
        return (f"at the model's precision (pass1_dtype={want!r}), going on as the prefill where that pays "
                f"(reuse_prefill={engine.reuse_prefill})")
    note = (f"at {str(low).removeprefix('torch.')} under autocast (pass1_dtype={want!r}), never reused as the prefill: "
            "TTFT = pass 1 + one full prefill")
    if want == "auto":
        note += f"; the exact pass 1, reused where that pays, for contexts within keep_length={engine.config.keep_length:g} tokens"
    return note


def bound_cells(q: dict, v: dict) -> str:
    """The ``bound | ratio / bound`` cells of a QGPM cell ``q`` against vanilla's ``v`` (medians):
    the bound ``1 + pass 1 / vanilla TTFT`` of a call that pays pass 1 plus one full prefill, and
    "reused" for a call whose pass 2 took part of its prefill from pass 1 (no such bound)."""
    if q["prefill_reused"]:
        return "reused | –"
    bound = 1.0 + q["pass1_s"] / v["ttft_s"]
    return f"{bound:.2f} | {q['ttft_s'] / v['ttft_s'] / bound:.2f}"


def measure(engine: QGPM, context: str, method: str, new_tokens: int) -> dict:
    cuda = engine.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        res = engine.answer(context, QUESTION, method=method, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        torch.cuda.synchronize()
        mem = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        with PeakRSS() as p:
            res = engine.answer(context, QUESTION, method=method, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        mem = p.delta_mib
    t = res.timings
    return {
        "prompt_tokens": res.usage.prompt_tokens,
        "ttft_s": t.first_token_s,
        "pass1_s": t.pass1_s,
        "decode_tok_s": (res.usage.answer_tokens - 1) / t.decode_s if t.decode_s > 0 else float("nan"),
        "peak_mib": mem,
        "answer": res.text,
        "remapped": method != "vanilla" and float(res.details.get("s_low", 1.0)) < 1.0,  # the plan moved or compressed something
        "pass2": res.details.get("pass2"),
        "prefill_reused": res.details.get("prefill_reused", 0),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--random-arch", choices=sorted(RANDOM_ARCHS), default=None, help="time a random-weight model of this shape")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for --random-arch")
    ap.add_argument("--heads", default=None, help="layer:head,... for --random-arch (default: SmolLM2's set, rescaled)")
    ap.add_argument("--second-heads", default=None,
                    help="layer:head,... : also time QGPM with this head set (e.g. a shallow one) in the same run, as 'qgpm B'")
    ap.add_argument("--second-pass1-dtype", default=None, metavar="DTYPE", choices=PASS1_DTYPES,
                    help="none | auto | bfloat16 | float16 | float32: 'qgpm B' runs pass 1 at this precision (QGPMConfig.pass1_dtype; "
                         "none = the model's own dtype, e.g. to time the exact pass 1 beside a preset that sets auto; with "
                         "--second-heads its head set, else the engine's)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a QGPMConfig field for the timed QGPM calls, on top of the engine's (repeatable)")
    ap.add_argument("--evidence-depth", type=float, default=None,
                    help="put the paragraph that answers the question at this depth of the context (0..1; default: where the text has it, "
                         "in its first tenth)")
    ap.add_argument("--baselines", default=None, metavar="METHODS",
                    help="also time these query-agnostic baselines (comma list of string, ms-poe, self-extend, at their defaults) "
                         "in the same run, interleaved, on the base engine")
    ap.add_argument("--compare-reuse", action="store_true",
                    help="also time, in the same run: qgpm without reuse_prefill, and a call that falls back to vanilla positions "
                         "(min_top_z=1e6) with and without it, all with the exact pass 1; where the engine's pass 1 runs at a lower "
                         "precision (pass1_dtype), also the exact pass 1 with the reuse and a fallback at the lower precision")
    args = ap.parse_args(argv)
    check_model_args(ap, args)
    sets = config_sets(ap, args.set)
    baselines = [m.strip() for m in args.baselines.split(",") if m.strip()] if args.baselines else []
    unknown = sorted(set(baselines) - {"string", "ms-poe", "self-extend"})
    if unknown:
        ap.error(f"--baselines takes string, ms-poe, self-extend; got {', '.join(unknown)}")
    if args.evidence_depth is not None and not 0.0 <= args.evidence_depth <= 1.0:
        ap.error("--evidence-depth must be in [0, 1]")
    if args.random_arch:
        engine = random_engine(args.random_arch, args.tokenizer, args.device, args.dtype, args.heads)
    else:
        engine = QGPM.from_pretrained(args.model, device_map=args.device, dtype=args.dtype)
    # The engine's settings with the two confidence rules off, so that every QGPM call pays the
    # remapped pass 2 (a call those rules return to vanilla positions costs pass 1 plus a vanilla prefill).
    timed_config = engine.config.with_(min_top_z=None, decisive_margin=None, **sets)
    engines = {"vanilla": engine, "qgpm": QGPM(engine.model, engine.tokenizer, heads=engine.heads, config=timed_config, name=engine.name)}
    if args.second_heads or args.second_pass1_dtype:
        second = [tuple(int(x) for x in h.split(":")) for h in args.second_heads.split(",")] if args.second_heads else engine.heads
        cfg_b = timed_config.with_(pass1_dtype=coerce_value(args.second_pass1_dtype)) if args.second_pass1_dtype else timed_config
        engines["qgpm B"] = QGPM(engine.model, engine.tokenizer, heads=second, config=cfg_b, name=engine.name)
    extras = []
    if args.compare_reuse:
        # The reuse applies to the exact pass 1 only: these calls run pass 1 at the model's precision.
        exact = timed_config.with_(pass1_dtype=None)
        fallback = exact.with_(min_top_z=1e6)
        labels = [("qgpm, no reuse", exact, False), ("falls back", fallback, True), ("falls back, no reuse", fallback, False)]
        low = engines["qgpm"].pass1_precision()
        if low is not None:  # the preset's lower-precision pass 1 beside the exact one, moved and falling back
            labels.insert(0, ("qgpm, exact pass 1", exact, True))
            labels.insert(2, (f"falls back, pass 1 at {str(low).removeprefix('torch.')}", timed_config.with_(min_top_z=1e6), True))
        for label, cfg, reuse in labels:
            engines[label] = QGPM(engine.model, engine.tokenizer, heads=engine.heads, config=cfg, name=engine.name, reuse_prefill=reuse)
            extras.append(label)
    method_of = {m: "vanilla" if m == "vanilla" else "qgpm" for m in engines}
    for b in baselines:
        engines[b], method_of[b] = engine, b
    text = long_text()
    heads = engine.heads
    deepest = max(l for l, _ in heads)
    expected = 1 + (deepest + 1) / engine.n_layers
    rows, remapped, pass2 = [], [], collections.Counter()
    paired: dict[int, dict[str, list[float]]] = {}
    for length in [int(x) for x in args.lengths.split(",")]:
        ctx = (context_of(engine, text, length - args.new_tokens) if args.evidence_depth is None
               else context_with_evidence_at(engine, text, length - args.new_tokens, args.evidence_depth))
        measure(engine, ctx, "vanilla", 4)  # warm-up at this length
        runs = {m: [] for m in engines}
        for _ in range(args.repeats):
            for m, e in engines.items():
                runs[m].append(measure(e, ctx, method_of[m], args.new_tokens))
        qgpm_runs = {m: rs for m, rs in runs.items() if method_of[m] == "qgpm"}
        remapped.append((length, {m: sum(bool(r["remapped"]) for r in rs) for m, rs in qgpm_runs.items()}))
        pass2.update(r["pass2"] for rs in qgpm_runs.values() for r in rs)
        med = {m: {k: statistics.median(r[k] for r in rs) for k in ("prompt_tokens", "ttft_s", "pass1_s", "decode_tok_s", "peak_mib", "prefill_reused")}
               for m, rs in runs.items()}
        rows.append((length, med))
        # decode ratio per round: each call against the vanilla call of the same round (drift between rounds cancels)
        paired[length] = {m: [r["decode_tok_s"] / v["decode_tok_s"] for r, v in zip(rs, runs["vanilla"])]
                          for m, rs in runs.items() if m != "vanilla"}
        print(json.dumps({"length": length, **med}), flush=True)
    dev = f"{engine.device.type}" + (f" ({torch.cuda.get_device_name()})" if engine.device.type == "cuda" else f" ({psutil.cpu_count()} cores, torch threads {torch.get_num_threads()})")
    lines = [
        f"# QGPM vs vanilla speed and memory ({engine.name}{' (random weights: timing only)' if args.random_arch else ''}, {dev}, dtype {next(engine.model.parameters()).dtype})",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        ("Evidence: the paragraph that answers the question sits where the benchmark text has it (in its first tenth)."
         if args.evidence_depth is None else f"Evidence: the paragraph that answers the question is put at depth {args.evidence_depth:g} of the context."),
        "",
        f"Medians of {args.repeats} runs per cell, methods interleaved, {args.new_tokens} new tokens per call. "
        f"Head set: {len(heads)} heads, deepest layer {deepest} of {engine.n_layers} -> expected TTFT ratio "
        f"1 + (deepest+1)/n_layers = {expected:.2f}. Python {platform.python_version()}, torch {torch.__version__}."
        + ("" if engine.device.type == "cuda" else (" CPU memory: peak RSS above the pre-call RSS, heap trimmed (malloc_trim) before each call."
                                                    if MALLOC_TRIM is not None else " CPU memory: peak RSS above the pre-call RSS (no glibc: heap not trimmed, figures depend on call order).")),
        "",
        f"QGPM settings: the engine's (relevance={timed_config.relevance}, remap={timed_config.remap}, split_layer={timed_config.split_layer}, z_window={timed_config.z_window}, "
        f"keep_length={timed_config.keep_length:g}{''.join(', --set ' + kv for kv in args.set)}) with the "
        "confidence rules off (min_top_z and decisive_margin None), so every QGPM call runs the remapped pass 2; "
        f"remapped calls per cell: {', '.join(f'{length}: ' + '/'.join(str(n) for n in counts.values()) for length, counts in remapped)} "
        f"({'/'.join(m for m in engines if method_of[m] == 'qgpm')}, of {args.repeats}); how pass 2 ran (result.details['pass2']): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(pass2.items()))}.",
        "",
        f"Pass 1 of the qgpm calls: {precision_note(engines['qgpm'])}. Bound: 1 + pass 1 / vanilla TTFT, for calls that pay pass 1 "
        "plus one full prefill (\"reused\" where pass 2 took part of its prefill from pass 1).",
        "",
        "| prompt tokens | TTFT vanilla (s) | TTFT qgpm (s) | of which pass 1 (s) | TTFT ratio | bound | ratio / bound | decode vanilla (tok/s) | decode qgpm (tok/s) | decode ratio | peak mem vanilla (MiB) | peak mem qgpm (MiB) | mem ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length, med in rows:
        v, q = med["vanilla"], med["qgpm"]
        lines.append(
            f"| {int(v['prompt_tokens'])} | {v['ttft_s']:.3f} | {q['ttft_s']:.3f} | {q['pass1_s']:.3f} | {q['ttft_s'] / v['ttft_s']:.2f} | "
            f"{bound_cells(q, v)} | {v['decode_tok_s']:.1f} | {q['decode_tok_s']:.1f} | {q['decode_tok_s'] / v['decode_tok_s']:.2f} | "
            f"{v['peak_mib']:.0f} | {q['peak_mib']:.0f} | {q['peak_mib'] / max(v['peak_mib'], 1e-9):.2f} |"
        )
    if "qgpm B" in engines:
        hb = engines["qgpm B"].heads
        deep_b = max(l for l, _ in hb)
        lines += [
            "",
            f"**qgpm B**: the same calls with the head set {' '.join(f'{l}:{h}' for l, h in hb)} (deepest layer {deep_b}, "
            f"expected TTFT ratio at the model's precision {1 + (deep_b + 1) / engine.n_layers:.2f}; pass 1: "
            f"{precision_note(engines['qgpm B'])}), timed in the same run, interleaved with the two above.",
            "",
            "| prompt tokens | TTFT qgpm B (s) | of which pass 1 (s) | TTFT ratio B | bound | ratio / bound | decode qgpm B (tok/s) | decode ratio B | peak mem qgpm B (MiB) | mem ratio B |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for length, med in rows:
            v, b = med["vanilla"], med["qgpm B"]
            lines.append(
                f"| {int(v['prompt_tokens'])} | {b['ttft_s']:.3f} | {b['pass1_s']:.3f} | {b['ttft_s'] / v['ttft_s']:.2f} | "
                f"{bound_cells(b, v)} | {b['decode_tok_s']:.1f} | {b['decode_tok_s'] / v['decode_tok_s']:.2f} | {b['peak_mib']:.0f} | "
                f"{b['peak_mib'] / max(v['peak_mib'], 1e-9):.2f} |"
            )
    if baselines:
        lines += [
            "",
            f"**Query-agnostic baselines** ({', '.join(baselines)}, each at its defaults, on the base engine): timed in the same "
            "run, interleaved with the calls above. They have no pass 1.",
            "",
            "| prompt tokens | method | TTFT (s) | TTFT ratio | decode (tok/s) | decode ratio | peak mem (MiB) | mem ratio |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for length, med in rows:
            v = med["vanilla"]
            for m in baselines:
                q = med[m]
                lines.append(
                    f"| {int(v['prompt_tokens'])} | {m} | {q['ttft_s']:.3f} | {q['ttft_s'] / v['ttft_s']:.2f} | {q['decode_tok_s']:.1f} | "
                    f"{q['decode_tok_s'] / v['decode_tok_s']:.2f} | {q['peak_mib']:.0f} | {q['peak_mib'] / max(v['peak_mib'], 1e-9):.2f} |"
                )
    if extras:
        lines += [
            "",
            "**Pass 1 going on as the prefill** (`QGPM.reuse_prefill`, on in the rows above): the same calls without it, and a call "
            "that falls back to vanilla positions (min_top_z=1e6) with and without it, each with pass 1 at the model's precision "
            "(the reuse applies to no other; where the rows above run a lower-precision pass 1, also the exact pass 1 with the "
            "reuse, and a fallback with the lower-precision pass 1), timed in the same run, interleaved. "
            "Prefill reused: prompt tokens whose vanilla states pass 2 took from pass 1 (median).",
            "",
            "| prompt tokens | calls | TTFT (s) | of which pass 1 (s) | TTFT ratio | prefill reused | decode ratio | mem ratio |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for length, med in rows:
            v = med["vanilla"]
            for m in ["qgpm"] + extras:
                q = med[m]
                lines.append(
                    f"| {int(v['prompt_tokens'])} | {m} | {q['ttft_s']:.3f} | {q['pass1_s']:.3f} | {q['ttft_s'] / v['ttft_s']:.2f} | "
                    f"{int(q['prefill_reused'])} | {q['decode_tok_s'] / v['decode_tok_s']:.2f} | {q['peak_mib'] / max(v['peak_mib'], 1e-9):.2f} |"
                )
    lines += [
        "",
        "**Decode ratio per round** (each call's decode speed over that of the vanilla call of the same round of the "
        "interleaving, so that drift between rounds cancels): median, lowest and highest over the rounds, and in how many "
        "rounds the call decoded at least as fast as vanilla.",
        "",
        "| prompt tokens | calls | median | lowest | highest | rounds ≥ 1 |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for length, med in rows:
        for m, ratios in paired[length].items():
            lines.append(f"| {int(med['vanilla']['prompt_tokens'])} | {m} | {statistics.median(ratios):.2f} | {min(ratios):.2f} | "
                         f"{max(ratios):.2f} | {sum(x >= 1.0 for x in ratios)} of {len(ratios)} |")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
