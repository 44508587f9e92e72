"""Command line: ``qgpm ask`` (main job), ``qgpm eval`` / ``tune`` / ``calibrate`` / ``report``.

    qgpm ask                                   # bundled report + question: vanilla and qgpm side by side
    qgpm ask "When does the winter ferry timetable start?"
    qgpm ask --quiet "..."                     # only the qgpm answer, for scripts
    qgpm ask --html why.html --plot why.png    # the explanation page and the relevance plot
    qgpm ask --methods vanilla,qgpm,topk,reorder "..."   # add the reranker baselines
    qgpm ask --methods qgpm,string,self-extend # the paper's RoPE baselines side by side
    qgpm ask --context notes.txt "..."         # your own text (use - for stdin)
    qgpm ask --methods oracle --evidence "exact sentence" "..."
    python -m qgpm --version

Every subcommand shares the flag names and meanings (``--model``, ``--device``,
``--dtype``, ``--heads``, ``--config``, ``--methods``, ``--reranker``); bad input is
reported in one line with exit code 2, before any model loads where it can be checked.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from importlib import resources
from typing import Sequence

from ._cliutil import (
    CONFIG_HELP,
    DEVICE_HELP,
    DTYPE_HELP,
    HEADS_HELP,
    RERANKER_HELP,
    VLLM_MODEL_HELP,
    VLLM_TIMEOUT_HELP,
    vllm_server_args,
    VLLM_URL_HELP,
    QGPMArgumentParser,
    UsageError,
    methods_arg,
    remote_call_config,
    run_cli,
    split_config_args,
)
from . import QGPM, __version__
from .baselines import options_from_strings, resolve_options
from .config import PRESETS, RECIPE, QGPMConfig
from .config_files import check_config_args, load_config
from .editing import check_k
from .ask_output import print_answer, print_why
from .explain import no_ranking_note, printable
from .fingerprint import gguf_shape
from .heads import find_head_set, has_head_set_for_shape, parse_heads
from .loading import parse_dtype, resolve_device, resolve_source, source_fingerprint
from .serving import VLLMServer
from .defaults import DEFAULT_K, DEFAULT_MODEL, DEFAULT_MODEL_NAME, DEFAULT_RERANKER, METHODS
from .methods import Stage, method_spec
from .prompt import check_prompt_inputs, check_template
from .rerank import check_reranker_spec
from .sources import parse_source

__all__ = ["main", "sample_document", "default_example", "build_parser"]


def _sample_meta() -> dict:
    return json.loads((resources.files("qgpm") / "data" / "sample" / "harbor_report.json").read_text(encoding="utf-8"))


def sample_document() -> tuple[str, list[dict]]:
    """The bundled long sample document and its example questions."""
    meta = _sample_meta()
    text = (resources.files("qgpm") / "data" / "sample" / meta["file"]).read_text(encoding="utf-8")
    return text, meta["questions"]


def default_example() -> int:
    """Index of the bundled question ``qgpm ask`` asks by default (``default_question`` in the
    sample's metadata, chosen by the rule stored next to it)."""
    return int(_sample_meta()["default_question"])


def _read_context(spec: str) -> str:
    try:
        if spec == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        with open(spec, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"--context {spec}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--context {spec}: not UTF-8 text ({exc.reason} at byte offset {exc.start}); convert it first, "
                         f"e.g. iconv -f latin1 -t utf-8 {'FILE' if spec == '-' else spec}") from None


def _check_heads_before_loading(args: argparse.Namespace, heads, config_file, overrides: Sequence[str]) -> None:
    """Method qgpm ranking with the model's heads needs a head set: look for one that fits the
    model before the weights load.

    The relevance source is the one the call will use: the last ``--config relevance=``, else
    the ``--config`` file's, else the model's own config (its preset, or :data:`~qgpm.config.RECIPE`).
    A reranker source reads no head and needs no set. A GGUF's header gives its shape in well
    under a second (transformers' own GGUF config reader parses the whole tokenizer and costs as
    much as the load), not which preset it gets: it is checked unless every preset and the recipe
    rank with a reranker. A folder's config and tokenizer give its full fingerprint. Where neither
    can be read the load itself reports the problem.
    """
    try:
        source = resolve_source(args.model, None)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    if heads is not None:
        return
    named = [v.split("=", 1)[1].strip() for v in overrides if v.split("=", 1)[0].strip() == "relevance"]
    chosen = named[-1] if named else load_config(config_file).relevance if config_file is not None else None
    if chosen is not None and not parse_source(chosen).heads:
        return
    if source.gguf_file:
        if chosen is None and not any(parse_source(c.relevance).heads for c in (RECIPE, *PRESETS.values())):
            return
        shape = gguf_shape(os.path.join(source.path, source.gguf_file))
        missing = shape is not None and not has_head_set_for_shape(shape)
        what = f"{source.name} ({shape})" if shape else source.name
    else:
        try:
            fp = source_fingerprint(source)
        except Exception:  # unreadable or remote config/tokenizer: the load reports it in full
            return
        chosen = chosen or QGPMConfig.for_model(fp).relevance
        if not parse_source(chosen).heads:
            return
        missing = find_head_set(fp) is None
        what = fp.describe()
    if missing:
        model = args.model or DEFAULT_MODEL
        raise UsageError(
            f"no head set is stored for {what}, and method qgpm here ranks with the model's heads (relevance="
            f"{chosen or 'heads'}, {'as set' if named or config_file else 'the preset of this model'}). Calibrate it once with `qgpm calibrate --model {model}` (stored for this model, found next "
            "time), or run with --heads calibrate (calibrate now, not stored), --heads FILE.json or --heads 14:3,15:6, or rank "
            "with a reranker (--config relevance=minilm); --methods vanilla,topk,reorder need no heads."
        )


def _prompt_args(args: argparse.Namespace) -> dict:
    """The prompt flags given, as ``answer`` keywords (``\\n`` / ``\\t`` read as a line break / a tab), checked before loading."""
    def text(value: str) -> str:
        return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], value)

    given = {k: text(v) for k in ("template", "instruction", "system", "answer_prefix") if (v := getattr(args, k)) is not None}
    try:
        if "template" in given:
            check_template(given["template"])
    except ValueError as exc:
        raise UsageError(f"--template: {exc}") from None
    if args.stop is not None:
        if any(not s for s in args.stop):
            raise UsageError("--stop is empty: give the text that ends an answer, e.g. --stop '\\n'")
        given["stop"] = [text(s) for s in args.stop]
    return given


def _ask(args: argparse.Namespace) -> int:
    text, questions = sample_document()
    if args.question is not None and not args.question.strip():
        raise UsageError("the question is empty: give one, or leave it out to ask the bundled example question")
    try:
        (args.question or "").encode("utf-8")
    except UnicodeEncodeError:  # bytes the shell passed that are no UTF-8 (surrogate-escaped by Python)
        raise UsageError("the question is not UTF-8 text: set the terminal's encoding to UTF-8, or convert it") from None
    if args.example is not None and (args.context or args.question):
        raise UsageError("--example picks a bundled question about the bundled document; with --context or a question of "
                         "your own it has no use: leave it out")
    if args.example is None:
        args.example = default_example()
    if not 0 <= args.example < len(questions):
        raise UsageError(f"--example must be 0..{len(questions) - 1}, got {args.example}")
    bundled = not args.context and not args.question
    if args.context:
        text = _read_context(args.context)
        if not args.question:
            raise UsageError('with --context, give a question: qgpm ask --context FILE "your question"')
    question = args.question or questions[args.example]["question"]
    methods = args.methods if args.methods is not None else (["qgpm"] if args.quiet else ["vanilla", "qgpm"])
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, got {args.top}")
    for flag, path in (("--html", args.html), ("--plot", args.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{flag} {path}: the folder {os.path.dirname(os.path.abspath(path))} does not exist")
    specs = [method_spec(m) for m in methods]
    if args.plot and not any(s.plan for s in specs):
        raise UsageError("--plot draws sentence relevance, so --methods must include qgpm or oracle")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'qgpm[eval]' (or leave --plot out)")
    evidence = list(args.evidence or [])
    if any(s.evidence for s in specs):
        if not evidence and bundled:
            evidence = [questions[args.example]["evidence"]]
        if not evidence:
            raise UsageError('method oracle needs --evidence "exact text from the context" (repeatable)')
    elif evidence:
        raise UsageError("--evidence is only used by method oracle (add it to --methods)")
    if any(not e.strip() for e in evidence):
        raise UsageError('--evidence is empty: give exact text from the context, e.g. --evidence "the sentence that answers"')
    missing = [e for e in evidence if e.strip() not in text]
    if missing:
        raise UsageError(f"--evidence {missing[0][:60]!r} is not an exact substring of the context")
    try:
        heads = parse_heads(args.heads)
        dtype = parse_dtype(args.dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if isinstance(heads, str) and heads != "calibrate":
        if not os.path.isfile(heads):
            raise UsageError(f"--heads {heads}: no such head-set file")
    try:
        options = options_from_strings(args.options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    unused = [m for m in options if m not in methods]
    if unused:
        raise UsageError(f"--option sets {', '.join(unused)}, which --methods {','.join(methods)} does not run")
    for m in methods:  # llmlingua-2 needs its compressor's path
        try:
            resolve_options(m, options.get(m))
        except ValueError as exc:
            raise UsageError(f"{exc} (set it with --option {m}.FIELD=VALUE)") from None
    try:
        check_prompt_inputs(text, question)  # an empty --context file, before the model loads
    except ValueError as exc:
        raise UsageError(f"{exc}") from None
    if args.reranker is not None and not any(s.reranker for s in specs):
        raise UsageError(f"--reranker sets the reranker of topk / reorder, which --methods {','.join(methods)} does not run")
    if args.k is not None and not any(s.takes_k for s in specs):
        raise UsageError(f"--k is how many chunks topk keeps, and --methods {','.join(methods)} does not run topk")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    for flag, value, check in (("--k", args.k, check_k), ("--reranker", args.reranker, check_reranker_spec)):
        try:
            if value is not None:
                check(value)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    prompt = _prompt_args(args)
    config_file, overrides = split_config_args(args.config, args.overrides)
    check_config_args(config_file, overrides)  # bad fields or values fail here, before the model loads
    if any(s.stage is Stage.HEADS for s in specs):
        _check_heads_before_loading(args, heads, config_file, overrides)  # a reranker relevance source needs no head set
    generator, server = None, vllm_server_args(args)
    if server is not None:
        try:
            generator = VLLMServer(args.vllm_url, **server)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    device_map = resolve_device(args.device)
    from transformers.utils import logging as hf_logging  # its weight-loading progress bars (the model, the reranker)

    hf_logging.enable_progress_bar() if args.verbose else hf_logging.disable_progress_bar()
    if not args.quiet:
        print(f"loading {args.model or 'the embedded ' + DEFAULT_MODEL_NAME} on {device_map} ...", file=sys.stderr)
    remote = remote_call_config(args.model, config_file, overrides) if generator is not None else None
    engine = QGPM.from_pretrained(args.model, device_map=device_map, dtype=None if dtype == "auto" else dtype, heads=heads, generator=generator,
                                  reuse_prefill=generator is None,  # pass 1's KV states stay here: nothing to reuse on a server
                                  config=remote)
    config = remote or load_config(config_file, overrides, base=engine.config)
    quiet = args.quiet
    if not quiet:
        print(f"question: {printable(' '.join(question.split()))}")
        if bundled:
            print(f"(bundled example; expected answer: {questions[args.example]['answer']})")
        legend = {"vanilla": "the model as it is, the context in its own order and positions",
                  "qgpm": "the same model, with the positions of the sentences most relevant to the question moved next to it"}
        for m in methods:
            if m in legend:
                print(f"  {m}: {legend[m]}")
    calls = []
    for method, spec in zip(methods, specs):
        kw = dict(method=method, max_new_tokens=args.max_new_tokens, config=config, **prompt)
        if spec.reranker:
            kw["reranker"] = args.reranker or DEFAULT_RERANKER
        if spec.takes_k and args.k is not None:
            kw["k"] = args.k
        if spec.evidence:
            kw["evidence"] = evidence
        if method in options:
            kw["options"] = options[method]
        engine.check_request(text, question, **kw)  # every method's call, before any answers (a family qgpm cannot patch)
        calls.append(kw)
    results = []
    for method, kw in zip(methods, calls):
        result = engine.answer(text, question, **kw)
        results.append((method, result))
        if quiet:
            print(printable(result.text.strip() if len(methods) == 1 else f"{method}\t{' '.join(result.text.split())}"), flush=True)
        else:
            print_answer(method, result, width=max(len(m) for m in methods), expected=questions[args.example]["answer"] if bundled else None)
    if not quiet:
        for method, result in results:
            print_why(method, result, args.top)
    shown = next((r for (_, r), sp in zip(results, specs) if sp.stage is Stage.HEADS), None) or next((r for _, r in results if r.relevance), results[-1][1])
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(shown.to_html())
        if not quiet:
            what = "the context shaded by relevance" if shown.relevance else no_ranking_note(shown)
            print(f"\nwrote {args.html} ({shown.method}: {what})")
    if args.plot:
        if not shown.relevance:
            raise UsageError(f"--plot needs a method that ranks sentences (qgpm or oracle); got {', '.join(methods)}")
        shown.plot().savefig(args.plot, dpi=120, bbox_inches="tight")
        if not quiet:
            print(f"wrote {args.plot} ({shown.method}: each sentence's {'relevance z' if shown.method == 'qgpm' else 'map score'} against its position in the context)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = QGPMArgumentParser(
        prog="qgpm",
        description="Query-Guided Positional Modulation for long-context QA.",
        epilog="Bad input is reported in one line (exit code 2); QGPM_TRACEBACK=1 shows tracebacks.",
    )
    ap.add_argument("--version", action="version", version=f"qgpm {__version__}", help="print the version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{ask,eval,tune,calibrate,report}")
    ask = sub.add_parser("ask", help="answer a question over a long text (default: the bundled sample report)",
                         description="Answer a question over a long text with one or more methods and show what QGPM ranked.")
    ask.add_argument("question", nargs="?", help="the question (default: a bundled example question)")
    ask.add_argument("--context", help="text file to answer from ('-' = stdin); default: the bundled report")
    ask.add_argument("--methods", "--method", dest="methods", type=methods_arg(), default=None,
                     help=f"comma list of {', '.join(METHODS)} (default vanilla,qgpm side by side; qgpm alone with "
                     "--quiet; oracle needs --evidence)")
    ask.add_argument("--option", dest="options", action="append", default=[], metavar="METHOD.FIELD=VALUE",
                     help="a baseline setting, e.g. string.local_window=256 or llmlingua-2.model=PATH (repeatable)")
    ask.add_argument("--evidence", action="append", metavar="TEXT",
                     help="exact text from the context that answers the question, for method oracle (repeatable; "
                     "the bundled example brings its own)")
    g = ask.add_argument_group("model")
    g.add_argument("--model", default=None, help=f"HF id, local folder or .gguf file (default: {DEFAULT_MODEL}, the embedded {DEFAULT_MODEL_NAME})")
    g.add_argument("--device", default="auto", help=DEVICE_HELP)
    g.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    g.add_argument("--heads", default=None, help=HEADS_HELP)
    g.add_argument("--config", action="append", default=None, metavar="FILE|FIELD=VALUE", help=CONFIG_HELP)
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE", help="same as --config FIELD=VALUE (repeatable)")
    g.add_argument("--vllm-url", default=None, metavar="URL", help=VLLM_URL_HELP)
    g.add_argument("--vllm-model", default=None, metavar="NAME", help=VLLM_MODEL_HELP)
    g.add_argument("--vllm-timeout", type=float, default=None, metavar="S", help=VLLM_TIMEOUT_HELP)
    pr = ask.add_argument_group("prompt", "QGPM's prompt around the context and the question; in these texts \\n and \\t stand for a "
                                "line break and a tab. A base model without a chat template needs a labelled question, an answer cue and "
                                "a stop string: --template '{instruction}\\n\\n{context}\\n\\nQuestion: {question}' --answer-prefix "
                                "'Answer:' --stop '\\n'")
    pr.add_argument("--template", default=None, help="the user message, with {instruction}, {context} and {question} (default: "
                    "instruction, context and question, a blank line apart)")
    pr.add_argument("--instruction", default=None, help="the instruction before the context (default: QGPM's)")
    pr.add_argument("--system", default=None, help="a system message (default: none, the chat template's own)")
    pr.add_argument("--answer-prefix", default=None, help="text that starts the answer, e.g. 'Answer:'")
    pr.add_argument("--stop", action="append", default=None, metavar="TEXT", help="end the answer at this text, e.g. '\\n' (repeatable)")
    ask.add_argument("--reranker", default=None, help=RERANKER_HELP)
    ask.add_argument("--k", type=int, default=None, help=f"chunks kept by topk (default {DEFAULT_K})")
    ask.add_argument("--max-new-tokens", type=int, default=48, help="answer budget in tokens (default 48)")
    ask.add_argument("--top", type=int, default=3, help="how many top-ranked sentences (or Top-K / Reorder chunks) to show (default 3)")
    meta = _sample_meta()  # read once for the default and the range shown in the help
    ask.add_argument("--example", type=int, default=None,
                     help=f"which bundled example question (0-{len(meta['questions']) - 1}, default {int(meta['default_question'])})")
    ask.add_argument("--verbose", "-v", action="store_true", help="also show the weight-loading progress bars")
    ask.add_argument("--quiet", "-q", action="store_true",
                     help="print only the answer (one line per method, 'METHOD<TAB>answer', when several), for scripts")
    ask.add_argument("--html", metavar="OUT.html", help="write the explanation page of the qgpm answer (self-contained HTML)")
    ask.add_argument("--plot", metavar="OUT.png", help="save the relevance plot of the qgpm answer (each sentence's relevance z against its position)")
    ask.set_defaults(func=_ask)
    try:
        from .eval.cli import register  # optional: the harness's subcommands need qgpm[eval]
    except ImportError:  # evaluation extras not installed
        register = None
    if register is not None:
        register(sub)
    return ap



def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
