"""Command line: ``qgpm ask`` (main job), ``qgpm eval`` / ``qgpm tune`` / ``qgpm calibrate``.

    qgpm ask                                   # bundled report + bundled question, embedded model
    qgpm ask "When does the winter ferry timetable start?"
    qgpm ask --method vanilla "..."            # compare with standard RoPE
    qgpm ask --methods qgpm,string,self-extend # the paper's RoPE baselines side by side
    qgpm ask --context notes.txt "..."         # your own text (use - for stdin)
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from typing import Sequence

__all__ = ["main", "sample_document"]


def sample_document() -> tuple[str, list[dict]]:
    """The bundled long sample document and its example questions."""
    base = resources.files("qgpm") / "data" / "sample"
    meta = json.loads((base / "harbor_report.json").read_text(encoding="utf-8"))
    text = (base / meta["file"]).read_text(encoding="utf-8")
    return text, meta["questions"]


def _ask(args: argparse.Namespace) -> int:
    from . import BASELINE_METHODS, METHODS, QGPM

    text, questions = sample_document()
    if args.context:
        text = sys.stdin.read() if args.context == "-" else open(args.context, encoding="utf-8").read()
        if not args.question:
            print("error: with --context, give a question: qgpm ask --context FILE \"your question\"", file=sys.stderr)
            return 2
    question = args.question or questions[args.example]["question"]
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    choices = [m for m in METHODS if m != "oracle"]  # oracle needs evidence marks
    unknown = [m for m in methods if m not in choices]
    if unknown or not methods:
        print(f"error: unknown method(s) {unknown}; choose from {', '.join(choices)}", file=sys.stderr)
        return 2
    from .baselines import options_from_strings

    try:
        options = options_from_strings(args.options)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"loading {args.model or 'the embedded SmolLM2-135M-Instruct'} ...", file=sys.stderr)
    engine = QGPM.from_pretrained(args.model, device_map=args.device, dtype=args.dtype)
    print(f"question: {question}")
    if not args.question and not args.context:
        print(f"(bundled example; expected answer: {questions[args.example]['answer']})")
    for method in methods:
        result = engine.answer(text, question, method=method, max_new_tokens=args.max_new_tokens, **({"options": options[method]} if method in options else {}))
        print(f"\n[{method}] {result.text}")
        t = result.timings
        print(
            f"  prompt {result.usage.prompt_tokens} tokens, answer {result.usage.answer_tokens} tokens; "
            f"first token {t.first_token_s:.1f}s (pass 1 {t.pass1_s:.1f}s), decode {t.decode_s:.1f}s",
        )
        if result.relevance:
            print(f"  sentences QGPM ranked most relevant (of {len(result.relevance)}):")
            for s in result.top_sentences(args.top):
                print(f"   #{s.rank + 1} z={s.z:+.2f} {s.text[:160]}")
        if result.edit is not None:
            print(f"  {method}: kept chunks {result.edit.kept} of {len(result.edit.chunks)}")
        if method in BASELINE_METHODS:
            print(f"  {method} settings: " + ", ".join(f"{k}={v}" for k, v in result.details.items()))
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="qgpm", description="Query-Guided Positional Modulation for long-context QA.")
    sub = ap.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer a question over a long text (default: the bundled sample report)")
    ask.add_argument("question", nargs="?", help="the question (default: a bundled example question)")
    ask.add_argument("--context", help="text file to answer from ('-' = stdin); default: the bundled report")
    ask.add_argument("--method", "--methods", dest="method", default="qgpm",
                     help="qgpm | vanilla | topk | reorder | string | ms-poe | self-extend | llmlingua-2, or several comma-separated")
    ask.add_argument("--option", dest="options", action="append", default=[], metavar="METHOD.FIELD=VALUE",
                     help="a baseline setting, e.g. string.local_window=256 or llmlingua-2.model=PATH (repeatable)")
    ask.add_argument("--model", default=None, help="HF id, local folder or .gguf (default: embedded SmolLM2-135M-Instruct)")
    ask.add_argument("--device", default=None, help="device_map for transformers, e.g. cuda or auto")
    ask.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: the checkpoint's)")
    ask.add_argument("--max-new-tokens", type=int, default=48)
    ask.add_argument("--top", type=int, default=3, help="how many top-ranked sentences to show")
    ask.add_argument("--example", type=int, default=1, help="which bundled example question (0-2)")
    ask.set_defaults(func=_ask)
    try:
        from .eval.cli import register
    except ImportError:  # evaluation extras not installed
        register = None
    if register is not None:
        register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
