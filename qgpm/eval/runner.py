"""Benchmark runner: every method on the same seeded samples, one JSONL row per answer.

    from qgpm.eval.runner import run_eval
    engine = QGPM.from_pretrained()
    run_eval(engine, tasks=["niah_multikey_1", "qa_1"], lengths=[2048, 4096],
             depths=[0, .25, .5, .75, 1], n=10, methods=["vanilla", "qgpm", "oracle"],
             out_dir="runs/x")

Work items and seeds
--------------------
A work item is one sample: ``(task, length, i, depth)``. Sample ``i`` is generated
with seed ``split_seed(split, i)`` (``generate(task, n=1, seed=..., depths=[depth])``),
so a run with ``n=20`` extends a run with ``n=10`` and sample ``i`` has the same needle
content at every depth and every length (results pair across depths and lengths). Every
method answers the same sample with the same prompt (only Top-K / Reorder edit the
context, by design). ``depths=None`` keeps each benchmark's random placement.

Rows
----
``rows.jsonl`` holds one row per (sample, method): task, length, depth, seed, index,
method, answer, correct, score, gold, logprob_gold (teacher-forced log-probability of
the gold continuation ``[" "] + answers[0]`` under the method's positions), prompt
tokens, timings, the top-ranked sentences (qgpm: first 3) and the rank of the evidence
sentence, split, and ``config_hash``. The hash fingerprints what decides a method's
answer: model, dtype, generation budget and haystack for every method, plus the QGPM
config (qgpm, oracle), the head set (qgpm), the reranker and ``k`` (topk, reorder), the
method's options (string, ms-poe, self-extend: :mod:`qgpm.baselines`). So a vanilla row
stays valid when only the QGPM config changes. ``manifest.json`` maps every hash to its
full settings. Reading, merging and writing these files: :mod:`qgpm.eval.rows`; the
fingerprint: :mod:`qgpm.eval.hashes`; one answer's row fields: :mod:`qgpm.eval.answering`;
work items and their samples: :mod:`qgpm.eval.work`.

Resuming: rows already present in ``out_dir`` with the same key (task, length, depth,
seed, method, config_hash) are skipped; a sample whose methods are all done is not even
generated. Rows that recorded an error are retried.

Data parallel: under ``accelerate launch`` (``accelerate.PartialState``) process ``r`` of
``P`` takes work items ``r, r + P, ...`` and appends to ``rows.rank{r}.jsonl``; after
``wait_for_everyone`` the main process merges every rank file into ``rows.jsonl``
(deduplicated, sorted) and writes the report. A plain single process works the same
way with ``P = 1``. ``shard=(r, P)`` shards by hand (separate jobs; each merges what
exists when it finishes, atomically, so the last one to finish leaves the full file).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import logging
import os
import platform
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from tqdm.auto import tqdm

from qgpm import QGPM
from qgpm.defaults import DEFAULT_K, DEFAULT_RERANKER
from qgpm.editing import check_k
from qgpm.engine import METHODS
from qgpm.eval.answering import answer_sample
from qgpm.eval.hashes import check_options, config_dict, config_hash, engine_dtype, engine_heads, method_fingerprint, reranker_name
from qgpm.eval.processes import Processes, split_processes
from qgpm.eval.rows import MANIFEST_FILE, ROWS_FILE, append_row, end_torn_line, merge_rows, norm_depth, rank_file, rank_files, read_manifest, read_rows, row_key, update_manifest
from qgpm.eval.work import DEFAULT_DEPTHS, WorkItem, prefetched_samples, select_items, work_items
from qgpm.heads import parse_heads as _parse_heads
from qgpm.loading import parse_dtype, resolve_device
from qgpm.methods import Stage, method_spec
from qgpm.rerank import check_reranker_spec
from qgpm.samples.base import EvalSample
from qgpm.samples.tasks import TASKS

__all__ = ["run_eval", "check_eval_args", "load_engine", "parse_heads"]

log = logging.getLogger("qgpm.eval")


# ----------------------------------------------------------------------------- engine


def parse_heads(spec: Any) -> Any:
    """``None`` / ``"calibrate"`` / a head-set path / ``"14:3,15:6"`` / a list of pairs (see :func:`qgpm.heads.parse_heads`)."""
    return _parse_heads(spec)


def _resolve_device(device: str | None, state=None) -> Any:
    """``device_map`` for :meth:`QGPM.from_pretrained` (see :func:`qgpm.loading.resolve_device`)."""
    return resolve_device(device, state)


def load_engine(model: Any = None, *, device: str | None = None, dtype: Any = None, heads: Any = None, config=None, state=None, **kwargs: Any):
    """Build a :class:`qgpm.QGPM` for evaluation (``device`` cpu|cuda|auto, ``dtype`` name or torch dtype)."""
    dtype = parse_dtype(dtype)
    if dtype == "auto":
        dtype = None
    return QGPM.from_pretrained(model, device_map=_resolve_device(device, state), dtype=dtype, heads=parse_heads(heads), config=config, **kwargs)


# ----------------------------------------------------------------------------- files


def _versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("transformers", "accelerate"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover
            pass
    try:
        v["qgpm"] = version("qgpm")
    except Exception:  # pragma: no cover
        pass
    return v


# ----------------------------------------------------------------------------- progress


class _Progress:
    """The progress bar (when asked for) with the running accuracy per method."""

    def __init__(self, total: int, procs: Processes, enabled: bool) -> None:
        self.right: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self.bar = None
        if enabled:
            multi = procs.world > 1
            self.bar = tqdm(total=total, desc=f"eval[{procs.rank}/{procs.world}]" if multi else "eval", unit="answer",
                            position=procs.rank if multi else None, dynamic_ncols=True, file=sys.stderr)

    def skip(self, answers: int) -> None:
        if self.bar is not None:
            self.bar.update(answers)

    def add(self, row: dict) -> None:
        if not row.get("error"):
            m = row["method"]
            self.total[m] = self.total.get(m, 0) + 1
            self.right[m] = self.right.get(m, 0) + int(row["correct"])
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(" ".join(f"{m}={100 * self.right[m] / self.total[m]:.0f}%" for m in self.total), refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------- the runner


def _check_run(methods: Sequence[str], tasks: Sequence[str], n: int, on_error: str) -> list[str]:
    """The methods without repeats; ValueError for an unknown method or task, ``n < 1``
    or a bad ``on_error``."""
    methods = list(dict.fromkeys(methods))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown methods {bad}; choose from {METHODS}")
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown tasks {bad}; choose from {TASKS}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if on_error not in ("record", "raise"):
        raise ValueError("on_error must be 'record' or 'raise'")
    return methods


def check_eval_args(*, tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float] | None, n: int, methods: Sequence[str],
                    split: str, out_dir: str | os.PathLike[str], reranker: Any = DEFAULT_RERANKER, k: int = DEFAULT_K,
                    on_error: str = "record", only: Iterable[tuple[str, int, float | None, int]] | None = None,
                    resume: bool = True, shard: tuple[int, int] | None = None) -> tuple[list[str], list[WorkItem]]:
    """What :func:`run_eval` can check before a model loads, as ``(methods without repeats, the
    run's work items)``: the methods and tasks, ``n``, the reranker spec and ``k`` of topk / reorder,
    the samples ``only`` names, and that ``out_dir`` holds rows of ``split`` only (rows of two
    splits would be counted together: the splits share their method hashes)."""
    methods = _check_run(methods, tasks, n, on_error)
    if reranker is not None and any(method_spec(m).reranker for m in methods):  # None: the default reranker
        check_reranker_spec(reranker)
    if any(method_spec(m).takes_k for m in methods):
        check_k(k)
    items = select_items(work_items(tasks, lengths, None if depths is None else [float(d) for d in depths], n, split), only)
    if resume or shard is not None:  # a manual shard's --no-resume keeps the other rows
        other = sorted({str(r.get("split")) for r in read_rows(out_dir) if r.get("split", split) != split})
        if other:
            raise ValueError(f"{out_dir} holds rows of the {', '.join(other)} split and this run is on {split}: a run folder holds "
                             "one split (their rows share method hashes and would be counted together); give another --out")
    return methods, items


def _prepare_out(out: Path, procs: Processes, shard: tuple[int, int] | None, resume: bool) -> None:
    """Create ``out``; without ``resume`` the main process clears every rows file and the manifest
    (a manual shard only its own rows file). A ``manifest.json`` there that cannot be read stops every process now,
    before any work (:func:`~qgpm.eval.rows.read_manifest`)."""
    out.mkdir(parents=True, exist_ok=True)
    read_manifest(out)
    if not resume:
        if shard is not None:
            rank_file(out, procs.rank).unlink(missing_ok=True)
        elif procs.rank == 0:  # the manifest too: its runs and configs described the rows cleared
            for f in [out / ROWS_FILE, *rank_files(out), out / MANIFEST_FILE]:
                f.unlink(missing_ok=True)
    procs.barrier()


def _pending(items: Sequence[WorkItem], methods: Sequence[str], hashes: dict[str, str], out: Path, resume: bool = True
             ) -> list[tuple[WorkItem, list[str]]]:
    """``(item, methods still to run)`` for the items with a method whose row is not in ``out``
    yet (rows that recorded an error are run again); without ``resume`` every item of this
    process (a manual shard's own, even where rows of it were merged into ``rows.jsonl``)."""
    done = {row_key(r) for r in read_rows(out) if not r.get("error")} if resume else set()
    pending = []
    for it in items:
        todo = [m for m in methods if (it.task, it.length, norm_depth(it.depth), it.seed, m, hashes[m]) not in done]
        if todo:
            pending.append((it, todo))
    return pending


def _answer_row(engine, sample: EvalSample, item: WorkItem, method: str, base: dict, config_hash: str, rank: int, on_error: str,
                answer_kw: dict) -> dict:
    """The row of one method on one sample; an error is recorded in it (``on_error="record"``)."""
    row = dict(base, method=method, config_hash=config_hash)
    try:
        row.update(answer_sample(engine, sample, method, **answer_kw))
    except Exception as exc:  # noqa: BLE001 - recorded, retried on resume
        if on_error == "raise":
            raise
        row.update(answer=None, correct=False, score=0.0, logprob_gold=None, error=f"{type(exc).__name__}: {exc}")
        log.warning("error in %s/%s @%s sample %s depth %s: %s", item.task, method, item.length, item.index, item.depth, row["error"])
    row["rank"] = rank
    return row


def _run_pending(engine, pending: Sequence[tuple[WorkItem, list[str]]], out: Path, procs: Processes, *, split: str,
                 hashes: dict[str, str], answer_kw: dict, on_error: str, haystack: Any, max_new_tokens: int | None,
                 prefetch: bool, progress: bool) -> int:
    """Answer every pending (item, method), appending rows to this process's rank file;
    returns the number of rows that recorded an error."""
    bar = _Progress(sum(len(ms) for _, ms in pending), procs, progress)
    tokenizer = copy.deepcopy(engine.tokenizer) if prefetch else engine.tokenizer  # the worker's own copy
    errors = 0
    try:
        end_torn_line(rank_file(out, procs.rank))  # a run killed mid-write: the next row starts on a line of its own
        with open(rank_file(out, procs.rank), "a", encoding="utf-8") as fh, \
                contextlib.closing(prefetched_samples(pending, tokenizer, haystack, max_new_tokens, prefetch)) as samples:
            for item, todo, sample in samples:
                if isinstance(sample, Exception):
                    warnings.warn(f"skipping {item.task} @ {item.length} (sample {item.index}, depth {item.depth}): {sample}")
                    bar.skip(len(todo))
                    continue
                base = {
                    "task": item.task, "length": item.length, "depth": norm_depth(item.depth), "seed": item.seed,
                    "index": item.index, "split": split, "metric": sample.metric, "gold": list(sample.answers),
                    "needle_depth": (sample.meta.get("needle_depths") or [None])[0],
                    "max_new_tokens": sample.max_new_tokens,
                }
                if sample.meta.get("template_id") is not None:  # NoLiMa: the needle's template, which sets the question
                    base["question_id"] = sample.meta["template_id"]
                for m in todo:
                    row = _answer_row(engine, sample, item, m, base, hashes[m], procs.rank, on_error, answer_kw)
                    errors += "error" in row
                    append_row(fh, row)
                    bar.add(row)
    finally:
        bar.close()
    return errors


def run_eval(
    engine: Any = None,
    *,
    tasks: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float] | None = DEFAULT_DEPTHS,
    n: int,
    methods: Sequence[str],
    out_dir: str | os.PathLike[str],
    split: str = "test",
    config=None,
    reranker: Any = DEFAULT_RERANKER,
    k: int = DEFAULT_K,
    logprob: bool = True,
    resume: bool = True,
    progress: bool = True,
    shard: tuple[int, int] | None = None,
    haystack: Any = None,
    max_new_tokens: int | None = None,
    on_error: str = "record",
    prefetch: bool = True,
    write_report: bool = True,
    command: str | None = None,
    model: Any = None,
    device: str | None = None,
    dtype: Any = None,
    heads: Any = None,
    options: dict[str, Any] | None = None,
    only: Iterable[tuple[str, int, float | None, int]] | None = None,
) -> Path:
    """Run ``methods`` on every sample of ``tasks x lengths x n x depths``; returns ``out_dir``.

    ``engine``: a built :class:`qgpm.QGPM`, or ``None`` to build one from ``model`` /
    ``device`` / ``dtype`` / ``heads`` (see :func:`load_engine`; under ``accelerate
    launch`` each process then loads onto its own GPU). ``config`` overrides the
    engine's QGPM config for qgpm / oracle. ``reranker`` / ``k`` configure topk /
    reorder. ``options`` maps a RoPE baseline to its settings, e.g.
    ``{"string": StringOptions(local_window=256)}`` (absent: the method's defaults).
    ``on_error="record"`` writes a row with ``error`` and goes on (retried on
    resume); ``"raise"`` stops. ``shard=(r, P)`` overrides the accelerate process split.
    ``only``: answer just these samples, as ``(task, length, depth, index)`` (see
    :func:`read_sample_ids`); one that is not among the run's samples is a ``ValueError``.
    """
    methods, items = check_eval_args(tasks=tasks, lengths=lengths, depths=depths, n=n, methods=methods, split=split, out_dir=out_dir,
                                     reranker=reranker, k=k, on_error=on_error, only=only, resume=resume, shard=shard)
    options = check_options(options)
    if depths is not None:
        depths = [float(d) for d in depths]
    out = Path(out_dir)
    procs = split_processes(shard)
    read_manifest(out)  # one that cannot be read stops the run before the model loads
    if engine is None or isinstance(engine, (str, os.PathLike)):
        engine = load_engine(engine if engine is not None else model, device=device, dtype=dtype, heads=heads, config=config, state=procs.state)
    window = engine.max_length
    longest = max((it.length for it in items), default=0)
    if window and longest > window:  # before _prepare_out deletes anything (--no-resume)
        raise ValueError(f"--lengths {longest} is longer than the model's window of {window} tokens: every sample of it would fail; "
                         f"give lengths up to {window} (a length is the whole budget, prompt and answer)")
    _prepare_out(out, procs, shard, resume)
    cfg = config or engine.config

    fps = {m: method_fingerprint(engine, m, config=cfg, reranker=reranker, k=k, max_new_tokens=max_new_tokens, haystack=haystack, options=options)
           for m in methods}
    hashes = {m: config_hash(fps[m]) for m in methods}
    pending = _pending(items[procs.rank::procs.world], methods, hashes, out, resume)
    n_calls = sum(len(ms) for _, ms in pending)
    started = time.time()
    if procs.rank == 0:
        log.info("qgpm eval: %d samples x %d methods (%d processes); %d answers to run here", len(items), len(methods), procs.world, n_calls)
        update_manifest(out, None, {hashes[m]: fps[m] for m in methods})  # before any row: a stopped run's rows keep their settings
    try:
        errors = _run_pending(engine, pending, out, procs, split=split, hashes=hashes, on_error=on_error, haystack=haystack,
                              max_new_tokens=max_new_tokens, prefetch=prefetch, progress=progress,
                              answer_kw=dict(config=cfg, reranker=reranker, k=k, logprob=logprob, options=options))
    except KeyboardInterrupt:  # the answers so far go into rows.jsonl too; a rerun resumes after them
        merge_rows(out)
        raise

    procs.barrier()
    if procs.rank == 0 or not procs.distributed:
        rows = merge_rows(out)
        entry = {
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "model": engine.name, "dtype": engine_dtype(engine), "device": str(engine.device),
            "heads": engine_heads(engine) if any(method_spec(m).stage is Stage.HEADS for m in methods) else None,
            "generator": getattr(getattr(engine, "generator", None), "name", "transformers"),
            "config": config_dict(cfg), "config_provenance": getattr(cfg, "provenance", None),
            "tasks": list(tasks), "lengths": [int(x) for x in lengths], "depths": depths, "n": n, "split": split,
            "methods": methods, "config_hashes": hashes, "reranker": reranker_name(reranker), "k": k,
            "options": {m: fps[m]["options"] for m in methods if "options" in fps[m]},
            "haystack": fps[methods[0]]["haystack"], "max_new_tokens": max_new_tokens, "logprob": logprob,
            "reuse_prefill": bool(getattr(engine, "reuse_prefill", False)),
            "processes": procs.world, "shard": list(shard) if shard else None, "answers_run_by_main": n_calls,
            "errors_main": errors, "wall_s": round(time.time() - started, 1), "rows": len(rows), "versions": _versions(),
        }
        update_manifest(out, entry, {hashes[m]: fps[m] for m in methods})
        if write_report:
            from qgpm.eval.report import report  # heavy: matplotlib and scipy, only when a report is written

            report(out)
    procs.barrier()
    return out
