"""Command-line entry points for evaluation: ``eval``, ``tune``, ``calibrate``, ``report``.

``register(subparsers)`` adds the subcommands to the main ``qgpm`` parser (each sets
``func`` to its ``main_*``, which takes the parsed args and returns an exit code).
Standalone: ``python -m qgpm.eval.cli eval ...``; data-parallel:
``accelerate launch [--num_processes N] -m qgpm.eval.cli eval ...``.

    qgpm eval --model smollm2 --tasks niah_multikey_1,qa_1 --lengths 2048,4096 \\
        --depths 0,0.25,0.5,0.75,1 --n 10 --methods vanilla,qgpm,oracle,topk,reorder \\
        --out runs/x --device cuda --dtype bfloat16
    qgpm tune --model smollm2 --tasks niah_multikey_1,nolima_direct --lengths 2048 --n 8 \\
        --trials 24 --out runs/tune --device cuda --dtype bfloat16
    qgpm eval --model smollm2 --methods string,ms-poe,self-extend --option string.local_window=256 ...
    qgpm calibrate --model smollm2 --n 36 --holdout 18 --top 8
    qgpm report --out runs/x
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Sequence

from tqdm.contrib.logging import logging_redirect_tqdm

from qgpm._cliutil import RERANKER_HELP, QGPMArgumentParser, methods_arg, remote_call_config, run_cli, split_config_args, vllm_server_args
from qgpm.baselines import options_from_strings
from qgpm.calibrate import HeadScores, calibrate_heads, check_depth_options, check_lengths, confidence_summary, fitting_lengths
from qgpm.config_files import check_config_args, load_config
from qgpm.defaults import COMPARISON_METHODS, DEFAULT_K, DEFAULT_RERANKER, METHODS
from qgpm.eval.cli_args import add_config_args, add_model_args, add_sample_args, command_line, lengths_arg, positive_int, shard_arg
from qgpm.eval.processes import partial_state
from qgpm.eval.report import report
from qgpm.eval.rows import read_rows
from qgpm.eval.runner import check_eval_args, load_engine, run_eval
from qgpm.eval.stats import series_labels
from qgpm.eval.tune import parse_grid, shard_items, tune
from qgpm.eval.work import read_sample_ids, work_items
from qgpm.heads import HeadSet, head_set_file_name, stored_head_set_path, user_head_dir
from qgpm.samples import CALIBRATION_LENGTHS, calibration_samples, check_data_packages

__all__ = ["register", "main", "main_eval", "main_tune", "main_calibrate", "main_report", "build_parser"]


def register(subparsers) -> None:
    """Add ``eval``, ``tune``, ``calibrate`` and ``report`` to an argparse subparsers object."""
    # ---- eval
    p = subparsers.add_parser("eval", help="run methods on benchmark samples and write rows + report",
                              description="Run every method on the same seeded benchmark samples; write rows.jsonl, report.md, plots. "
                              "Data-parallel with `accelerate launch -m qgpm.eval.cli eval ...`.")
    add_model_args(p)
    add_sample_args(p, split_choices=("test", "dev"), default_split="test", default_n=10)
    p.add_argument("--methods", type=methods_arg(), default=list(COMPARISON_METHODS),
                   help=f"comma list of {', '.join(METHODS)} (default: {','.join(COMPARISON_METHODS)}; the baselines run when listed)")
    p.add_argument("--reranker", default=DEFAULT_RERANKER, help=RERANKER_HELP)
    p.add_argument("--k", type=int, default=DEFAULT_K, help=f"chunks kept by topk (default {DEFAULT_K})")
    p.add_argument("--option", dest="options", action="append", default=[], metavar="METHOD.FIELD=VALUE",
                   help="a baseline setting, e.g. string.local_window=256, self-extend.group_size=4, ms-poe.max_ratio=2, "
                   "llmlingua-2.model=PATH (repeatable; fields of qgpm.StringOptions / SelfExtendOptions / MsPoEOptions / LLMLingua2Options)")
    add_config_args(p)
    p.add_argument("--out", required=True, help="output folder (resumed if it holds rows)")
    p.add_argument("--no-logprob", dest="logprob", action="store_false", help="skip the gold log-prob (scored in the answer's own prefill; saves little)")
    p.add_argument("--no-resume", dest="resume", action="store_false", help="start afresh (deletes the folder's rows)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--shard", type=shard_arg, default=None, help="manual sharding i/N (separate jobs); accelerate launch shards by itself")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first error (default: record it in the row and go on)")
    p.add_argument("--only", default=None, metavar="FILE",
                   help="answer only the samples named in FILE (JSONL, one {task, length, depth, index} object a line, "
                   "e.g. from benchmarks/run_on_units.py); each must be one of the run's samples")
    p.set_defaults(func=main_eval)

    # ---- tune
    p = subparsers.add_parser("tune", help="search QGPM hyperparameters on the dev split",
                              description="Grid / random search over QGPMConfig fields on dev-split samples (never test).")
    add_model_args(p)
    add_sample_args(p, split_choices=("dev",), default_split="dev", default_n=8)
    add_config_args(p)
    p.add_argument("--grid", default=None, help="'field=v1,v2;field=v1,v2' (default: qgpm.eval.tune.default_grid of the base config: the shaping fields it reads)")
    p.add_argument("--trials", type=positive_int, default=None, help="random sample of this many grid points (base config included); default: the whole grid")
    p.add_argument("--search-seed", type=int, default=0, help="seed of the random choice of --trials grid points (default 0)")
    p.add_argument("--objective", choices=["accuracy", "logprob", "guarded"], default="accuracy",
                   help="accuracy (tie-break: gold log-prob), logprob, or guarded (no task below vanilla first)")
    p.add_argument("--guard", type=float, default=0.0, help="tolerated per-task accuracy drop vs vanilla for --objective guarded (fraction)")
    p.add_argument("--oracle", action="store_true", help="also answer every trial with the Oracle (evidence labels in place of the heads)")
    p.add_argument("--methods", type=methods_arg(("qgpm", "oracle")), default=None,
                   help="what answers each trial: qgpm (default), qgpm,oracle (= --oracle) or oracle (the remapping's ceiling alone); the first ranks trials")
    p.add_argument("--shard", type=shard_arg, default=None, help="answer only samples i, i+N, ... (i/N); merge the shards' tune_rows.jsonl and rerun without it for the summary")
    p.add_argument("--out", required=True, help="output folder (tune_rows.jsonl, trials.jsonl, best_config.json, tune_summary.md; resumed)")
    p.add_argument("--no-logprob", dest="logprob", action="store_false", help="skip the gold log-prob (the tie-break of --objective accuracy)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=main_tune)

    # ---- calibrate
    p = subparsers.add_parser("calibrate", help="select retrieval heads by MRR calibration (paper App. A)",
                              description="Score every (layer, head) on calibration-split samples, keep the best --top, "
                              "and store the head set where the engine finds it by the model's fingerprint.")
    add_model_args(p, heads=False, answers=False)
    p.add_argument("--n", type=int, default=None, help="calibration samples (default 36; not with --scores-from)")
    p.add_argument("--holdout", type=int, default=18, help="held-out samples for the fused-MRR check (default 18)")
    p.add_argument("--top", type=int, default=8, help="heads to keep (default 8)")
    p.add_argument("--lengths", type=lengths_arg, default=None,
                   help="token lengths of the calibration samples, comma list (default 1024,2048, those the model's window holds)")
    p.add_argument("--max-layer", type=int, default=None,
                   help="only heads in layers < this (pass 1 then stops there: a cheaper extra prefill)")
    p.add_argument("--shallow-tolerance", type=float, default=None,
                   help="also find the best set in layers < --shallow-bound (default: the lower half) and keep it when its "
                        "held-out fused MRR is at most this much below the unrestricted set's (needs --holdout > 0)")
    p.add_argument("--shallow-bound", type=int, default=None,
                   help="with --shallow-tolerance: the shallow set's layer bound (heads in layers < this; default: half the layers)")
    p.add_argument("--scores-from", default=None, metavar="HEADS_JSON",
                   help="reuse the per-head calibration MRRs stored in this head-set file (same model) instead of scoring "
                        "--n samples again; the held-out check still runs")
    p.add_argument("--out", default=None, help="head-set JSON path (default: <user head dir>/<model>--<fingerprint key>-<weights digest, 8>.json, found by the model's fingerprint)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=main_calibrate)

    # ---- report
    p = subparsers.add_parser("report", help="regenerate report.md, stats.json and plots from a run folder")
    p.add_argument("--out", required=True, help="run folder holding rows.jsonl")
    p.add_argument("--baseline", default="vanilla", help="method the paired statistics compare against (default vanilla)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the accuracy-vs-depth plots")
    p.set_defaults(func=main_report)


def _setup_logging() -> None:
    """qgpm's own progress notes (INFO) on stderr; other libraries' only from WARNING (their
    INFO lines, as sentence-transformers' "Load pretrained ...", broke the progress bar)."""
    logging.basicConfig(format="%(message)s")
    logging.getLogger("qgpm").setLevel(logging.INFO)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _engine(args, config=None, heads=None):
    if not getattr(args, "progress", True):  # --no-progress: transformers' weight-loading bars too
        from transformers.utils import logging as hf_logging  # heavy: transformers, only as a model loads

        hf_logging.disable_progress_bar()
    kw = {}
    if getattr(args, "attn_implementation", None):
        kw["attn_implementation"] = args.attn_implementation
    if not getattr(args, "reuse_prefill", True):
        kw["reuse_prefill"] = False
    if getattr(args, "vllm_url", None):
        from qgpm.serving import VLLMServer  # heavy: httpx and the rich/click of its CLI (about 70 ms here), only with --vllm-url

        kw["generator"] = VLLMServer(args.vllm_url, **vllm_server_args(args))
        kw["reuse_prefill"] = False  # pass 1's KV states stay here: nothing to reuse on the server
        kw["pass1_layers_only"] = not getattr(args, "logprob", True)  # the gold log-prob is scored here, on every layer
    return load_engine(args.model, device=args.device, dtype=args.dtype, heads=heads if heads is not None else getattr(args, "heads", None),
                       config=config, state=partial_state(), **kw)


def _engine_and_config(args):
    """The engine and the config of ``--config`` / ``--set``: overrides apply on top of the
    JSON file, else on top of the model's preset (``None`` when neither is given)."""
    config_file, overrides = split_config_args(args.config, args.overrides)
    check_config_args(config_file, overrides)  # bad fields or values fail before the model loads
    remote = remote_call_config(args.model, config_file, overrides) if getattr(args, "vllm_url", None) else None
    engine = _engine(args, config=remote)  # with a remote generator, the pass-1 layers the config's calls read
    config = remote or load_config(config_file, overrides, base=engine.config)
    if config is not None:
        engine.config = config
    return engine, config


def main_eval(args) -> int:
    _setup_logging()
    vllm_server_args(args)  # --vllm-model / --vllm-timeout without --vllm-url, a bad timeout: before the model loads
    options = options_from_strings(getattr(args, "options", []) or [])  # bad settings fail before the model loads
    tasks = args.tasks or ["niah_multikey_1", "nolima_direct"]
    only = None
    if args.only is not None:
        only = read_sample_ids(args.only)  # a bad file fails before the model loads
    check_data_packages()  # the samples' data and RULER's metrics, before the model loads
    check_eval_args(tasks=tasks, lengths=args.lengths, depths=args.depths, n=args.n, methods=args.methods, split=args.split,
                    out_dir=args.out, reranker=args.reranker, k=args.k, only=only, resume=args.resume, shard=args.shard)  # likewise
    engine, config = _engine_and_config(args)
    t = time.time()
    with logging_redirect_tqdm():  # log lines above the progress bar, not through it
        out = run_eval(
            engine, tasks=tasks, lengths=args.lengths, depths=args.depths, n=args.n, methods=args.methods, out_dir=args.out,
            split=args.split, config=config, reranker=args.reranker, k=args.k, logprob=args.logprob, resume=args.resume,
            progress=args.progress, shard=args.shard, haystack=args.haystack, max_new_tokens=args.max_new_tokens,
            on_error="raise" if args.fail_fast else "record", command=command_line(args), options=options, only=only,
        )
    state = partial_state()
    if state is None or state.is_main_process:
        print(f"done in {time.time() - t:.0f} s: {out / 'rows.jsonl'}, {out / 'report.md'}")
    return 0


def main_tune(args) -> int:
    _setup_logging()
    vllm_server_args(args)  # as in eval
    grid = parse_grid(args.grid) if args.grid else None  # a bad grid fails before the model loads
    if args.oracle and args.methods is not None and "oracle" not in args.methods:
        raise ValueError(f"--oracle adds the Oracle to the methods, but --methods {','.join(args.methods)} leaves it out: "
                         "give --methods qgpm,oracle, or one of the two flags")
    tasks = args.tasks or ["niah_multikey_1", "nolima_direct"]
    check_data_packages()  # as in eval
    if args.shard is not None:  # a shard without samples fails before the model loads
        shard_items(work_items(tasks, args.lengths, args.depths, args.n, args.split), args.shard)
    engine, base = _engine_and_config(args)
    with logging_redirect_tqdm():
        summary = tune(
            engine, tasks=tasks, lengths=args.lengths, depths=args.depths, n=args.n, out_dir=args.out,
            grid=grid, trials=args.trials, search_seed=args.search_seed, base_config=base,
            split=args.split, objective=args.objective, guard=args.guard, logprob=args.logprob, progress=args.progress,
            haystack=args.haystack, max_new_tokens=args.max_new_tokens, command=command_line(args), oracle=args.oracle,
            methods=args.methods, shard=args.shard,
        )
    b, v = summary["best"], summary["vanilla"]
    print(f"best trial #{b['trial']}: acc {100 * (b['acc'] or 0):.1f}% (vanilla {100 * (v['acc'] or 0):.1f}%), changes {b['changes']}")
    print(f"wrote {os.path.join(args.out, 'tune_summary.md')} and best_config.json")
    return 0


def main_calibrate(args) -> int:
    check_data_packages()  # before the model loads
    if args.out is not None and os.path.isdir(args.out):  # found only when the set was written, after the whole calibration
        raise ValueError(f"--out {args.out} is a folder: give the head-set file to write, e.g. {os.path.join(args.out, 'heads.json')}")
    check_depth_options(args.max_layer, args.shallow_tolerance, has_holdout=args.holdout > 0,
                        shallow_bound=args.shallow_bound)  # before the model loads
    scores = earlier = None
    if args.scores_from is not None and args.n is not None:
        raise ValueError(f"--n {args.n} sets how many samples to score, but --scores-from reuses stored scores and scores none: "
                         "give one of them")
    n = 36 if args.n is None else args.n
    for flag, value, low in (("--top", args.top, 1), ("--n", n, 1), ("--holdout", args.holdout, 0)):
        if value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    if args.scores_from is not None:  # read before the model loads: a bad file fails fast
        earlier = HeadSet.load(args.scores_from)
        scores = HeadScores.from_head_set(earlier)
    _setup_logging()
    engine = _engine(args, heads=[(0, 0)])  # any valid head: calibration scores them all
    engine.require_supported()  # a family qgpm cannot patch fails here, before any sample is built
    if earlier is not None and earlier.fingerprint and earlier.fingerprint.get("key") != engine.fingerprint.key:
        raise ValueError(f"--scores-from {args.scores_from} was calibrated on {earlier.fingerprint.get('name') or '?'} "
                         f"(fingerprint key {earlier.fingerprint.get('key')}), not on {engine.name} ({engine.fingerprint.key}): "
                         "drop --scores-from to calibrate this model")
    lengths = args.lengths or fitting_lengths(CALIBRATION_LENGTHS, engine.max_length)  # by default: those the window holds
    if scores is None or args.holdout > 0:
        check_lengths(engine, lengths)  # before any sample is built
    t = time.time()
    cal = calibration_samples(engine.tokenizer, n=n, lengths=lengths) if scores is None else []
    hold = calibration_samples(engine.tokenizer, n=args.holdout, lengths=lengths, offset=1000) if args.holdout > 0 else None
    hs = calibrate_heads(engine, cal, top=args.top, holdout=hold, progress=args.progress,
                         max_layer=args.max_layer, shallow_tolerance=args.shallow_tolerance,
                         shallow_bound=args.shallow_bound, scores=scores)
    if earlier is not None:
        hs.meta["scores_from"] = {"path": str(args.scores_from), "created": earlier.meta.get("created"),
                                  "command": earlier.meta.get("command"), "seconds": earlier.meta.get("seconds")}
        before = earlier.meta.get("confidence") or {}
        if (hs.meta["confidence"].get("min_top_z") is None and before.get("min_top_z") is not None
                and [list(h) for h in earlier.heads] == [list(h) for h in hs.heads]):
            # no sample scored now (--holdout 0): the same heads keep the threshold measured with them
            hs.meta["confidence"] = {**before, "from": str(args.scores_from)}
    hs.meta["command"] = command_line(args)
    hs.meta["lengths"] = list(lengths)
    hs.meta["seconds"] = round(time.time() - t, 1)
    out = args.out or os.path.join(user_head_dir(), head_set_file_name(engine.fingerprint))
    path = hs.save(out)
    print(f"model: {engine.name} (fingerprint key {engine.fingerprint.key})")
    print(f"heads (best first): {hs.heads}")
    print(f"per-head calibration MRR: {[round(x, 3) for x in hs.mrr]} (median head {hs.meta['median_head_mrr']:.3f})")
    if "holdout_fused_mrr" in hs.meta:
        print(f"held-out fused MRR ({hs.meta['holdout_samples']} samples): chosen {hs.meta['holdout_fused_mrr']:.3f} "
              f"vs random {args.top}-head sets {hs.random_mrr:.3f} (mean of {hs.meta['random_draws']} draws)")
    conf = hs.meta.get("confidence") or {}
    # calibrate_heads has logged a weak threshold it measured with the advice; a kept one it has not
    print(confidence_summary(conf, advice=bool(conf.get("from"))) + (f" (kept from {conf['from']})" if conf.get("from") else ""))
    if "shallow" in hs.meta:
        sh = hs.meta["shallow"]
        print(f"shallow set (layers < {sh['max_layer']}): held-out fused MRR {sh['shallow_holdout_fused_mrr']:.3f} vs unrestricted "
              f"{sh['unrestricted_holdout_fused_mrr']:.3f} (tolerance {sh['tolerance']}): kept the {sh['kept']} set")
    print(f"wrote {path}")
    found = stored_head_set_path(engine.fingerprint)
    if args.out is None and found is not None and os.path.abspath(found) == os.path.abspath(path):
        print(f"QGPM.from_pretrained({args.model!r}) will now use it")
    elif args.out is not None:
        print(f"use it with --heads {path} or QGPM.from_pretrained(..., heads={str(path)!r})")
    return 0


def main_report(args) -> int:
    rows = read_rows(args.out)
    methods = sorted({r.get("method") for r in rows})
    series = sorted(set(series_labels(rows).values()))
    if methods and args.baseline not in methods and args.baseline not in series:
        raise ValueError(f"--baseline {args.baseline}: no rows of that method or series in {args.out} (its series: {', '.join(series)})")
    path = report(args.out, baseline=args.baseline, plots=args.plots)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = QGPMArgumentParser(prog="qgpm", description="qgpm evaluation commands")
    sub = ap.add_subparsers(dest="command", required=True)
    register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
