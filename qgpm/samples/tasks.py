"""Offline, seeded benchmark task generators.

``generate(task, n=..., length=..., tokenizer=..., seed=..., depths=...)`` returns
:class:`EvalSample` objects ready for ``QGPM.answer(context=..., question=...,
instruction=..., template=..., answer_prefix=..., evidence=..., max_new_tokens=...)``
and for the harness's scorer :func:`qgpm.eval.scoring.score` (``sample.metric``,
``sample.answers``; this package imports nothing from :mod:`qgpm.eval`).

Tasks (:data:`TASKS`)
---------------------
* RULER (:mod:`qgpm.samples.ruler`): ``niah_single_2``, ``niah_multikey_1``,
  ``niah_multikey_2``, ``niah_multivalue``, ``qa_1`` (SQuAD), ``qa_2`` (HotpotQA).
* NoLiMa-style, own needle set (:mod:`qgpm.samples.nolima`): ``nolima_direct``,
  ``nolima_assoc``; ``haystack="essays"`` or ``"squad"`` (or any paragraph source).
* Lost-in-the-Middle key-value retrieval (:mod:`qgpm.samples.kv`): ``kv_retrieval``.

Token budget
------------
``length`` is the total budget in tokens of ``tokenizer``: the prompt as the engine's
builder renders and tokenizes it from the sample's parts
(``qgpm.prompt.count_prompt_tokens(tokenizer, sample.prompt_spec())``: the chat template
around ``sample.user_message()``, then ``sample.answer_prefix``; no extra special
tokens) plus ``sample.max_new_tokens`` is at most ``length``, with the
haystack size chosen by search to come as close as the haystack's unit allows (a word
for essays, a sentence, a needle line, a JSON record, a document). The reached prompt
size is in ``sample.meta["prompt_tokens"]``. The parts are measured as they are: the
engine strips surrounding whitespace from the question before answering
(:func:`qgpm.prompt.normalize_spec`), so the few QA questions that end in a space are
answered with a prompt that can be a token shorter than measured.

Depth
-----
``depths=None`` keeps each benchmark's random placement (``sample.depth is None``).
With ``depths=[0, .25, .5, .75, 1]`` each depth gets ``n`` samples (depth-major order);
sample ``i`` has the same needle content at every depth and every length, so results pair
up. NIAH / NoLiMa: the queried needle sits at the sentence boundary closest to the
relative character position ``depth``. QA: the gold document(s) sit at document index
``round(depth * (n_docs - n_gold))``. KV: the gold record sits at index
``round(depth * (n_records - 1))``. ``sample.meta["needle_depths"]`` holds the realised
relative character position of every evidence string.

Splits: calibration / dev / test
--------------------------------
Seeds come in three disjoint ranges, :data:`SPLIT_SEEDS` (test ``0..999999``, dev
``1000000..1999999``, calibration ``2000000..2999999``); get them with
``split_seed(split, i)``. The split of a seed decides the content pool every generator
draws from, and the pools are disjoint across splits:

* NIAH keys: the adjective of every "adjective-noun" key comes from the split's third of
  the adjective list;
* QA: SQuAD questions by article (so a gold paragraph never serves two splits),
  HotpotQA by question;
* NoLiMa: the split's third of the needle templates and of the character names;
* KV: the gold key's first hex digit (mod 3) is the split's slot.

So a calibration sample (used to pick retrieval heads) or a dev sample (used to tune
hyperparameters) can never coincide with a test sample. Haystack text is shared, as in
RULER (its essay haystack is always the same prefix of the essays).
"""

from __future__ import annotations

from typing import Any, Sequence

from qgpm.samples.base import (
    SPLIT_SEEDS,
    SPLITS,
    BudgetError,
    EvalSample,
    render_user_message,
    split_of_seed,
    split_seed,
)
from qgpm.samples.kv import KV_TASKS, generate_kv
from qgpm.samples.nolima import NOLIMA_TASKS, generate_nolima
from qgpm.samples.ruler import NIAH_TASKS, QA_TASKS, generate_niah, generate_qa
from qgpm.prompt import render_prompt

__all__ = [
    "TASKS",
    "EvalSample",
    "generate",
    "SPLITS",
    "SPLIT_SEEDS",
    "split_seed",
    "split_of_seed",
    "render_user_message",
    "sample_prompt",
    "BudgetError",
    "calibration_samples",
    "CALIBRATION_TASKS",
]

TASKS: tuple[str, ...] = (*NIAH_TASKS, *QA_TASKS, *NOLIMA_TASKS, *KV_TASKS)


def generate(
    task: str,
    *,
    n: int,
    length: int,
    tokenizer: Any,
    seed: int,
    depths: Sequence[float] | None = None,
    haystack: Any = None,
    max_new_tokens: int | None = None,
) -> list[EvalSample]:
    """Generate ``n`` samples of ``task`` (``n`` per depth when ``depths`` is given).

    ``haystack`` (a registered name such as ``"essays"`` / ``"squad"``, or a function
    returning paragraphs) applies to the NoLiMa tasks and to the essay-haystack NIAH tasks
    (default: each task's own). ``max_new_tokens`` overrides the task's generation budget.
    Raises :class:`BudgetError` when ``length`` is too small for the bare prompt.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if depths is not None:
        depths = [float(d) for d in depths]
        bad = [d for d in depths if not 0.0 <= d <= 1.0]
        if bad:
            raise ValueError(f"depths must lie in [0, 1], got {bad}")
    kw = dict(n=n, length=int(length), tokenizer=tokenizer, seed=int(seed), depths=depths, max_new_tokens=max_new_tokens)
    if task in NIAH_TASKS:
        return generate_niah(task, haystack=haystack, **kw)
    if haystack is not None and task not in NOLIMA_TASKS:
        raise ValueError(f"task {task!r} has a fixed haystack; 'haystack' applies to NoLiMa and essay NIAH tasks")
    if task in QA_TASKS:
        return generate_qa(task, **kw)
    if task in NOLIMA_TASKS:
        return generate_nolima(task, haystack=haystack if haystack is not None else "essays", **kw)
    if task in KV_TASKS:
        return generate_kv(task, **kw)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def sample_prompt(sample: EvalSample, tokenizer: Any) -> str:
    """The exact prompt text the budget was measured on (chat template + answer prefix),
    rendered by the engine's prompt builder (:func:`qgpm.prompt.render_prompt`)."""
    return render_prompt(tokenizer, sample.prompt_spec()).text


CALIBRATION_TASKS: tuple[str, ...] = ("niah_single_2", "niah_multikey_1", "nolima_direct", "nolima_assoc", "kv_retrieval", "qa_1")


CALIBRATION_LENGTHS: tuple[int, ...] = (1024, 2048)
"""The token budgets of calibration samples by default (``heads="calibrate"``, ``qgpm calibrate``)."""


def calibration_samples(
    tokenizer: Any,
    *,
    n: int = 24,
    lengths: Sequence[int] = CALIBRATION_LENGTHS,
    tasks: Sequence[str] = CALIBRATION_TASKS,
    offset: int = 0,
) -> list[EvalSample]:
    """``n`` synthetic head-calibration samples from the *calibration* split.

    Samples cycle over ``tasks`` and ``lengths`` with random needle depths; their seeds
    and needle keys are disjoint from the dev and test splits, so heads chosen on them
    never saw an evaluation sample. ``offset`` selects a different, still disjoint, batch
    (e.g. a held-out batch for reporting the chosen heads' MRR).
    """
    out: list[EvalSample] = []
    i = 0
    while len(out) < n:
        task = tasks[i % len(tasks)]
        length = lengths[(i // len(tasks)) % len(lengths)]
        out.extend(generate(task, n=1, length=length, tokenizer=tokenizer, seed=split_seed("calibration", offset + i)))
        i += 1
    return out[:n]
