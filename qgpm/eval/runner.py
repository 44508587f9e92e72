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
full settings. Reading, merging and writing these files: :mod:`qgpm.eval.rows`.

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
import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import platform
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from qgpm import QGPM
from qgpm.baselines import BASELINE_METHODS, resolve_options
from qgpm.calibrate import evidence_sentences
from qgpm.config import CALIBRATED
from qgpm.defaults import DEFAULT_K, DEFAULT_RERANKER
from qgpm.methods import Stage, method_spec
from qgpm.heads import parse_heads as _parse_heads
from qgpm.loading import parse_dtype, resolve_device
from qgpm.eval.rows import ROWS_FILE, append_row, merge_rows, norm_depth, rank_file, rank_files, read_rows, row_key, update_manifest
from qgpm.eval.scoring import is_correct, score
from qgpm.engine import METHODS
from qgpm.samples.base import BudgetError, EvalSample, split_seed
from qgpm.samples.nolima import NOLIMA_TASKS
from qgpm.samples.ruler import NIAH_TASKS
from qgpm.samples.tasks import TASKS, generate

__all__ = [
    "run_eval",
    "WorkItem",
    "work_items",
    "method_fingerprint",
    "answer_stop",
    "config_hash",
    "load_engine",
    "parse_heads",
    "gold_continuation",
    "prepare_kwargs",
    "answer_sample",
    "DEFAULT_DEPTHS",
    "engine_dtype",
    "partial_state",
    "make_sample",
]

log = logging.getLogger("qgpm.eval")

DEFAULT_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


# ----------------------------------------------------------------------------- work


@dataclasses.dataclass(frozen=True)
class WorkItem:
    """One sample to generate: ``index`` is ``i`` in ``split_seed(split, i)``."""

    task: str
    length: int
    depth: float | None
    index: int
    seed: int


def work_items(tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float] | None, n: int, split: str) -> list[WorkItem]:
    """All samples of a run in a fixed order: length, task, sample, depth.

    Shorter lengths come first (early results); consecutive items differ in depth, so
    taking every ``P``-th item gives each process a similar mix of lengths and depths.
    """
    ds: list[float | None] = [None] if depths is None else [float(d) for d in depths]
    out = []
    for length in lengths:
        for task in tasks:
            for i in range(n):
                for d in ds:
                    out.append(WorkItem(task, int(length), d, i, split_seed(split, i)))
    return out


# ----------------------------------------------------------------------------- fingerprints


def engine_dtype(engine) -> str:
    """The dtype name of ``engine``'s weights (``"bfloat16"``, ...), ``"?"`` when it has none."""
    try:
        return str(next(engine.model.parameters()).dtype).replace("torch.", "")
    except (StopIteration, AttributeError):
        return "?"


def _reranker_name(reranker: Any) -> str:
    if reranker is None:
        return DEFAULT_RERANKER  # what the engine uses for None
    return str(getattr(reranker, "name", reranker))


# Config fields added after rows were first committed: hashed only when they are not at
# their "off" value, so rows made before they existed keep their config_hash.
_HASHED_WHEN_SET = {"local_window": 0.0, "keep_length": 0.0, "unmodulated_layers": 0, "anchor_basis": "context", "min_top_z": None,
                    "decisive_margin": None, "remap": "stride", "z_window": None,
                    "lead_tokens": 0, "solo_margin": None, "placement": "question", "local_layers": None, "term_ratio": None,
                    "moved_order": "rank", "split_run_ons": False, "pass1_dtype": None, "relevance": "heads"}


def _config_dict(config) -> dict:
    d = dataclasses.asdict(config)
    d.pop("provenance", None)
    for name, off in _HASHED_WHEN_SET.items():
        if d.get(name) == off:
            d.pop(name, None)
    return d


def method_fingerprint(
    engine,
    method: str,
    *,
    config=None,
    reranker: Any = DEFAULT_RERANKER,
    k: int = DEFAULT_K,
    max_new_tokens: int | None = None,
    haystack: Any = None,
    options: Any = None,
) -> dict:
    """What decides ``method``'s answer on a sample (hashed into ``config_hash``).

    ``options``: a ``{method: options}`` mapping (or one baseline's options object); a
    baseline absent from it runs with its defaults. Baseline rows hash every option field."""
    fp: dict[str, Any] = {
        "method": method,
        "model": engine.name,
        "dtype": engine_dtype(engine),
        "max_new_tokens": max_new_tokens,
        "haystack": None if haystack is None else str(getattr(haystack, "__name__", haystack)),
    }
    cfg = config or engine.config
    spec = method_spec(method)
    if spec.config:
        fp["config"] = _config_dict(cfg)
    if spec.stage is Stage.HEADS:
        fp["heads"] = [list(h) for h in engine.heads]
        if cfg.min_top_z == CALIBRATED:  # the threshold it stands for on this engine's head set
            fp["calibrated_min_top_z"] = engine.head_set.min_top_z if engine.head_set is not None else None
        low = engine.pass1_precision(cfg)
        if low is not None:  # what "auto" became on this hardware; absent at the model's dtype (earlier rows keep their hashes)
            fp["pass1_precision"] = str(low).removeprefix("torch.")
    if spec.reranker:
        fp["reranker"] = _reranker_name(reranker)
        fp["k"] = int(k)
    if spec.options:
        fp["options"] = resolve_options(method, _options_for(method, options)).to_dict()
    stop = answer_stop(engine)
    if stop:  # absent for chat models (earlier rows keep their hashes)
        fp["stop"] = list(stop)
    generator = getattr(getattr(engine, "generator", None), "name", "transformers")
    if generator != "transformers":  # absent for this process's own generator (earlier rows keep their hashes)
        fp["generator"] = generator
    return fp


PLAIN_TEXT_STOP = ("\n\n",)


def answer_stop(engine) -> tuple[str, ...]:
    """The harness's stop strings for ``engine``'s model: none for a model with a chat template
    (its end-of-turn token ends the answer); ``PLAIN_TEXT_STOP`` for a model prompted as plain
    text (a base model such as Gemma-3-270M), whose answer is its first paragraph: such a model
    has no end of turn and writes on past the answer (another "The special magic number for ...
    is: ..." line, often with another number), which a substring metric would otherwise score.
    A stop string keeps its usual meaning (as on a vLLM server): an answer that begins with a
    blank line ends empty."""
    return () if getattr(engine.tokenizer, "chat_template", None) else PLAIN_TEXT_STOP


def _options_for(method: str, options: Any) -> Any:
    """``method``'s entry of a ``{method: options}`` mapping (None: its defaults), or
    ``options`` itself when it is one method's options object."""
    if isinstance(options, dict):
        return options.get(method)
    return options


def check_options(options: Any) -> dict:
    """Validate a ``{method: options}`` mapping for :func:`run_eval` (each value an options
    object of that method, or a dict of its fields); returns it with objects as values."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"options must map method names to options, e.g. {{'string': StringOptions(...)}}, got {type(options).__name__}")
    bad = [m for m in options if m not in BASELINE_METHODS]
    if bad:
        raise ValueError(f"options given for {bad}: only {', '.join(BASELINE_METHODS)} take options")
    return {m: resolve_options(m, o) for m, o in options.items()}


def config_hash(fingerprint: dict) -> str:
    return hashlib.sha1(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]


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


# ----------------------------------------------------------------------------- answering


def gold_continuation(sample: EvalSample) -> str:
    """The gold answer as the model would continue the prompt: ``answers[0]``, with a
    leading space when the answer prefix ends in a word (``"... is"`` -> ``" 1234"``)."""
    ans = sample.answers[0]
    prefix = sample.answer_prefix or ""
    if prefix and not prefix[-1].isspace() and not ans[:1].isspace():
        return " " + ans
    return ans


def prepare_kwargs(sample: EvalSample, method: str, *, config=None, reranker: Any = DEFAULT_RERANKER, k: int = DEFAULT_K, options: Any = None) -> dict:
    """The ``engine.answer`` / ``engine.prepare`` keyword arguments for one sample and method."""
    kw: dict[str, Any] = dict(
        method=method,
        instruction=sample.instruction,
        template=sample.template,
        answer_prefix=sample.answer_prefix,
        max_new_tokens=sample.max_new_tokens,
        evidence=sample.evidence if method_spec(method).evidence else None,
        config=config,
    )
    if method_spec(method).reranker:
        kw.update(reranker=reranker, k=k)
    if method_spec(method).options:
        kw["options"] = _options_for(method, options)
    return kw


def _evidence_rank(call, sample: EvalSample) -> int | None:
    """Best (0-based) QGPM rank of a sentence holding evidence, or None."""
    if not call.relevance or call.prompt is None:
        return None
    try:
        gold = evidence_sentences(call.prompt, sample.evidence)
    except Exception:  # evidence not located: no rank
        return None
    ranks = {r.index: r.rank for r in call.relevance}
    return min((ranks[g] for g in gold if g in ranks), default=None)


def answer_sample(engine, sample: EvalSample, method: str, *, config=None, reranker: Any = DEFAULT_RERANKER, k: int = DEFAULT_K, logprob: bool = True, call=None,
                  options: Any = None) -> dict:
    """Answer one sample with one method; the measured part of a row.

    One :meth:`QGPM.prepare` (edit, pass 1, plan) and one prefill serve both the
    generated answer and the gold log-prob (:meth:`QGPM.generate_prepared` with
    ``score=``). ``call``: an already prepared call for this sample (e.g. from
    :meth:`QGPM.replan`), used instead of preparing one.
    """
    t0 = time.perf_counter()
    if call is None:
        call = engine.prepare(sample.context, sample.question, **prepare_kwargs(sample, method, config=config, reranker=reranker, k=k, options=options))
    t_run = time.perf_counter()
    res = engine.generate_prepared(call, max_new_tokens=sample.max_new_tokens, stop=answer_stop(engine),
                                   score=gold_continuation(sample) if logprob else None)
    tm = res.timings
    out = {
        "answer": res.text,
        "correct": bool(is_correct(sample.metric, res.text, sample.answers)),
        "score": float(score(sample.metric, res.text, sample.answers)),
        "logprob_gold": res.details.score_logprob,
        "prompt_tokens": res.usage.prompt_tokens,
        "answer_tokens": res.usage.answer_tokens,
        "finish_reason": res.finish_reason,
        # prefill_s includes the gold tokens scored in the same forward (logprob_s of it)
        "timings": {
            "edit_s": round(tm.edit_s, 4), "pass1_s": round(tm.pass1_s, 4), "plan_s": round(tm.plan_s, 4),
            "prefill_s": round(tm.prefill_s, 4), "decode_s": round(tm.decode_s, 4), "answer_s": round(tm.total_s, 4),
            "logprob_s": round(res.details.score_s or 0.0, 4), "run_s": round(time.perf_counter() - t_run, 4),
            "wall_s": round(time.perf_counter() - t0, 4),
        },
    }
    spec = method_spec(method)
    if spec.stage is Stage.HEADS:
        out["top_sentences"] = [s.text for s in res.top_sentences(3)]
        out["evidence_rank"] = _evidence_rank(call, sample)
        out["num_sentences"] = len(res.relevance)
        out["top_z"] = [None if s.z is None else round(float(s.z), 3) for s in res.top_sentences(3)]
        out["prefill_reused"] = int(res.details.prefill_reused or 0)  # prompt tokens pass 1's continued prefill saved
    if spec.config:
        d = call.details
        out["anchor_length"] = d.anchor_length
        out["s_low"] = d.s_low
        out["flat_relevance"] = bool(d.flat_relevance)
        out["decisive_relevance"] = bool(d.decisive_relevance)
        if d.solo_relevance:
            out["solo_relevance"] = True
        if d.term_dropped is not None:
            out["term_dropped"] = int(d.term_dropped)
    if spec.options:
        out["baseline"] = dict(call.details)  # every fact of the call: STRING's S and W, LLMLingua-2's token counts
    if spec.reranker and res.edit is not None:
        out["chunks"] = len(getattr(res.edit, "chunks", []) or [])
        out["kept_chunks"] = len(getattr(res.edit, "kept", []) or [])
        out["evidence_kept"] = all(ev.strip() in res.edit.text for ev in sample.evidence)
    return out


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


# ----------------------------------------------------------------------------- distributed


def partial_state() -> Any:
    """``accelerate.PartialState`` (long barrier timeout), or None when accelerate is missing.

    Under ``accelerate launch`` it tells this process its index and the process count;
    a plain process gets index 0 of 1."""
    try:
        from accelerate import PartialState  # optional: only processes started by `accelerate launch` need it
    except ImportError:  # plain single process
        return None
    # Without CUDA (or with ACCELERATE_USE_CPU) processes launched by `accelerate launch
    # --multi_gpu` / torchrun must join a gloo group: PartialState only does so with cpu=True.
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    try:
        return PartialState(cpu=cpu, timeout=_dt.timedelta(hours=48))
    except TypeError:  # pragma: no cover - older accelerate without kwargs passthrough
        return PartialState(cpu=cpu)


class _Single:
    process_index = 0
    local_process_index = 0
    num_processes = 1
    is_main_process = True
    device = torch.device("cpu")

    def wait_for_everyone(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class _Processes:
    """This process's share of a run: it takes work items ``rank, rank + world, ...``."""

    state: Any  # accelerate.PartialState or _Single: barriers
    rank: int
    world: int
    distributed: bool  # several processes of one accelerate launch (not a manual shard)

    def barrier(self) -> None:
        if self.distributed:
            self.state.wait_for_everyone()


def _processes(shard: tuple[int, int] | None) -> _Processes:
    """The process split: ``shard=(r, P)`` by hand, else accelerate's (one process without it)."""
    state = partial_state() or _Single()
    if shard is None:
        return _Processes(state, state.process_index, state.num_processes, state.num_processes > 1)
    rank, world = int(shard[0]), int(shard[1])
    if not 0 <= rank < world:
        raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
    return _Processes(state, rank, world, False)


# ----------------------------------------------------------------------------- progress


class _Progress:
    """The progress bar (when asked for) with the running accuracy per method."""

    def __init__(self, total: int, procs: _Processes, enabled: bool) -> None:
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


# ----------------------------------------------------------------------------- samples


def _haystack_for(task: str, haystack: Any) -> Any:
    """``haystack`` where the task takes one (NoLiMa, essay NIAH), else None."""
    if haystack is None:
        return None
    if task in NOLIMA_TASKS:
        return haystack
    if task in NIAH_TASKS and NIAH_TASKS[task].get("haystack") == "essay":
        return haystack
    return None


def make_sample(tokenizer: Any, item: WorkItem, haystack: Any, max_new_tokens: int | None) -> EvalSample | BudgetError:
    """Generate ``item``'s sample (``haystack`` only where the task takes one); the
    :class:`BudgetError` instead of raising it when the prompt cannot fit ``item.length``."""
    try:
        s = generate(
            item.task, n=1, length=item.length, tokenizer=tokenizer, seed=item.seed,
            depths=None if item.depth is None else [item.depth], haystack=_haystack_for(item.task, haystack),
            max_new_tokens=max_new_tokens,
        )[0]
        return s
    except BudgetError as exc:
        return exc


def _samples(pending: Sequence[tuple[WorkItem, list[str]]], tokenizer: Any, haystack: Any, max_new_tokens: int | None,
             prefetch: bool) -> Iterator[tuple[WorkItem, list[str], EvalSample | BudgetError]]:
    """``(item, methods, sample)`` for every pending item, in order. With ``prefetch`` a
    worker thread generates the next sample while the caller answers the current one."""
    if not (prefetch and pending):
        for item, todo in pending:
            yield item, todo, make_sample(tokenizer, item, haystack, max_new_tokens)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qgpm-eval-gen")
    try:
        future = pool.submit(make_sample, tokenizer, pending[0][0], haystack, max_new_tokens)
        for j, (item, todo) in enumerate(pending):
            sample = future.result()
            if j + 1 < len(pending):  # generate the next sample while the model works
                future = pool.submit(make_sample, tokenizer, pending[j + 1][0], haystack, max_new_tokens)
            yield item, todo, sample
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


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


def _prepare_out(out: Path, procs: _Processes, shard: tuple[int, int] | None, resume: bool) -> None:
    """Create ``out``; without ``resume`` the main process clears every rows file (a manual
    shard only its own)."""
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        if shard is not None:
            rank_file(out, procs.rank).unlink(missing_ok=True)
        elif procs.rank == 0:
            for f in [out / ROWS_FILE, *rank_files(out)]:
                f.unlink(missing_ok=True)
    procs.barrier()


def read_sample_ids(path: str | os.PathLike[str]) -> list[tuple[str, int, float | None, int]]:
    """Sample ids ``(task, length, depth, index)`` from a JSONL file, one object a line with
    those four keys (other keys are allowed: ``benchmarks/run_on_units.py`` writes such files)."""
    ids = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            ids.append((str(d["task"]), int(d["length"]), norm_depth(d["depth"]), int(d["index"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}, line {n}: expected a JSON object with task, length, depth and index ({exc})") from None
    return ids


def _only(items: list[WorkItem], only: Iterable[tuple[str, int, float | None, int]] | None) -> list[WorkItem]:
    """The items named by ``only`` (all of them when it is ``None``); a named sample the run
    does not hold raises before any model work."""
    if only is None:
        return items
    want = {(t, int(length), norm_depth(d), int(i)) for t, length, d, i in only}
    have = {(it.task, it.length, norm_depth(it.depth), it.index): it for it in items}
    missing = sorted(want - set(have), key=str)
    if missing:
        raise ValueError(f"only= names {len(missing)} sample(s) outside this run's tasks x lengths x depths x n, e.g. {missing[0]}; "
                         "widen --tasks / --lengths / --depths / --n or drop them from the file")
    return [it for key, it in have.items() if key in want]


def _pending(items: Sequence[WorkItem], methods: Sequence[str], hashes: dict[str, str], out: Path) -> list[tuple[WorkItem, list[str]]]:
    """``(item, methods still to run)`` for the items with a method whose row is not in ``out``
    yet (rows that recorded an error are run again)."""
    done = {row_key(r) for r in read_rows(out) if not r.get("error")}
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


def _run_pending(engine, pending: Sequence[tuple[WorkItem, list[str]]], out: Path, procs: _Processes, *, split: str,
                 hashes: dict[str, str], answer_kw: dict, on_error: str, haystack: Any, max_new_tokens: int | None,
                 prefetch: bool, progress: bool) -> int:
    """Answer every pending (item, method), appending rows to this process's rank file;
    returns the number of rows that recorded an error."""
    bar = _Progress(sum(len(ms) for _, ms in pending), procs, progress)
    tokenizer = copy.deepcopy(engine.tokenizer) if prefetch else engine.tokenizer  # the worker's own copy
    errors = 0
    try:
        with open(rank_file(out, procs.rank), "a", encoding="utf-8") as fh, \
                contextlib.closing(_samples(pending, tokenizer, haystack, max_new_tokens, prefetch)) as samples:
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
    methods = _check_run(methods, tasks, n, on_error)
    options = check_options(options)
    if depths is not None:
        depths = [float(d) for d in depths]
    out = Path(out_dir)
    procs = _processes(shard)
    _prepare_out(out, procs, shard, resume)
    if engine is None or isinstance(engine, (str, os.PathLike)):
        engine = load_engine(engine if engine is not None else model, device=device, dtype=dtype, heads=heads, config=config, state=procs.state)
    cfg = config or engine.config

    fps = {m: method_fingerprint(engine, m, config=cfg, reranker=reranker, k=k, max_new_tokens=max_new_tokens, haystack=haystack, options=options)
           for m in methods}
    hashes = {m: config_hash(fps[m]) for m in methods}
    items = _only(work_items(tasks, lengths, depths, n, split), only)
    pending = _pending(items[procs.rank::procs.world], methods, hashes, out)
    n_calls = sum(len(ms) for _, ms in pending)
    started = time.time()
    if procs.rank == 0:
        log.info("qgpm eval: %d samples x %d methods (%d processes); %d answers to run here", len(items), len(methods), procs.world, n_calls)
    errors = _run_pending(engine, pending, out, procs, split=split, hashes=hashes, on_error=on_error, haystack=haystack,
                          max_new_tokens=max_new_tokens, prefetch=prefetch, progress=progress,
                          answer_kw=dict(config=cfg, reranker=reranker, k=k, logprob=logprob, options=options))

    procs.barrier()
    if procs.rank == 0 or not procs.distributed:
        rows = merge_rows(out)
        entry = {
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "model": engine.name, "dtype": engine_dtype(engine), "device": str(engine.device),
            "heads": [list(h) for h in engine.heads] if any(method_spec(m).stage is Stage.HEADS for m in methods) else None,
            "generator": getattr(getattr(engine, "generator", None), "name", "transformers"),
            "config": _config_dict(cfg), "config_provenance": getattr(cfg, "provenance", None),
            "tasks": list(tasks), "lengths": [int(x) for x in lengths], "depths": depths, "n": n, "split": split,
            "methods": methods, "config_hashes": hashes, "reranker": _reranker_name(reranker), "k": k,
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
