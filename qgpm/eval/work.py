"""What a run answers: its work items, their samples, and the subset a file names.

A work item is one sample, ``(task, length, index, depth)``; sample ``index`` is generated
with seed ``split_seed(split, index)``, so a run with ``n=20`` extends one with ``n=10`` and
the same index holds the same needle content at every depth and length (see
:mod:`qgpm.eval.runner`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from qgpm.eval.rows import norm_depth
from qgpm.samples.base import BudgetError, EvalSample, split_seed
from qgpm.samples.nolima import NOLIMA_TASKS
from qgpm.samples.ruler import NIAH_TASKS
from qgpm.samples.tasks import generate

__all__ = ["DEFAULT_DEPTHS", "WorkItem", "work_items", "make_sample", "prefetched_samples", "read_sample_ids", "select_items"]

DEFAULT_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


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


def prefetched_samples(pending: Sequence[tuple[WorkItem, list[str]]], tokenizer: Any, haystack: Any, max_new_tokens: int | None,
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


def select_items(items: list[WorkItem], only: Iterable[tuple[str, int, float | None, int]] | None) -> list[WorkItem]:
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

