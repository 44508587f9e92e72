"""Shared pieces of the task generators: the sample type and its builder, seed splits,
token-budget fitting and needle placement. Prompts are rendered and measured with the
engine's own builder (:func:`qgpm.prompt.count_prompt_tokens`).

Seed splits
-----------
Every generated sample is a pure function of ``(task, seed, index, length, depth,
tokenizer)``. Seeds are cut into three disjoint ranges (:data:`SPLIT_SEEDS`); the range a
seed falls in names its split, and the generators draw the *content* that identifies a
sample (needle keys, character names, needle templates, QA questions) from a pool that
belongs to that split only (:func:`split_slot`, :func:`split_pool`). So a calibration
sample can never equal a dev or test sample, even in its needle. Use
:func:`split_seed` to get seeds: ``split_seed("test", 0)``.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence, TypeVar

from qgpm.prompt import PromptSpec

__all__ = [
    "EvalSample",
    "SPLITS",
    "SPLIT_SEEDS",
    "split_seed",
    "split_of_seed",
    "split_slot",
    "split_pool",
    "sample_rng",
    "render_user_message",
    "build_sample",
    "BudgetError",
    "fit_units",
    "join_items",
    "closest_gap",
    "relative_position",
]

T = TypeVar("T")

SPLITS: tuple[str, ...] = ("test", "dev", "calibration")

SPLIT_SEEDS: dict[str, range] = {
    "test": range(0, 1_000_000),
    "dev": range(1_000_000, 2_000_000),
    "calibration": range(2_000_000, 3_000_000),
}
"""Disjoint seed ranges. ``test`` starts at 0, so RULER's customary seed 42 is a test seed."""


def split_seed(split: str, i: int = 0) -> int:
    """The ``i``-th seed of ``split`` (``i`` >= 0)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    r = SPLIT_SEEDS[split]
    if not 0 <= i < len(r):
        raise ValueError(f"seed index {i} is outside split {split!r} (0..{len(r) - 1})")
    return r.start + i


def split_of_seed(seed: int) -> str:
    """The split whose seed range holds ``seed``; ValueError outside every range."""
    for name, r in SPLIT_SEEDS.items():
        if seed in r:
            return name
    raise ValueError(
        f"seed {seed} is in no split; use split_seed(split, i) "
        + ", ".join(f"{k}: {r.start}..{r.stop - 1}" for k, r in SPLIT_SEEDS.items())
    )


def split_slot(split: str) -> int:
    """0, 1 or 2: which third of every content pool belongs to ``split``."""
    return SPLITS.index(split)


def split_pool(items: Sequence[T], split: str) -> list[T]:
    """The items of ``split``: every third item, starting at its slot (disjoint across splits)."""
    return list(items[split_slot(split) :: len(SPLITS)])


def sample_rng(*parts: Any) -> random.Random:
    """A ``random.Random`` seeded by a string (sha512-based, independent of PYTHONHASHSEED)."""
    # The "qgpm.eval|" prefix names where these generators used to live; it stays, so that
    # every sample (and every stored result keyed by it) is the same as before the move.
    return random.Random("qgpm.eval|" + "|".join(str(p) for p in parts))


@dataclass
class EvalSample:
    """One benchmark sample.

    ``template`` is the user message with the placeholders ``{instruction}``,
    ``{context}`` and ``{question}``; :func:`render_user_message` fills it (with
    ``str.format``, so braces inside the context are kept as they are). ``answer_prefix``
    goes after the assistant tag of the chat template. ``evidence`` holds exact
    substrings of ``context`` that carry the answer; ``depth`` is the requested needle /
    gold-document depth (``None`` for RULER's random placement); ``length`` is the total
    token budget the prompt was fitted to (prompt + ``max_new_tokens`` <= ``length``).
    """

    task: str
    length: int
    depth: float | None
    seed: int
    index: int
    instruction: str
    context: str | list[str]
    question: str
    answer_prefix: str
    template: str
    answers: list[str]
    evidence: list[str]
    metric: str
    max_new_tokens: int
    meta: dict = field(default_factory=dict)

    def user_message(self) -> str:
        return render_user_message(self.template, self.instruction, self.context, self.question)

    def prompt_spec(self) -> PromptSpec:
        """The prompt parts as the engine takes them; the generator fitted the token budget
        on exactly this spec (:func:`qgpm.prompt.count_prompt_tokens`)."""
        return PromptSpec(context=self.context, question=self.question, instruction=self.instruction,
                          answer_prefix=self.answer_prefix, template=self.template)

    def to_dict(self) -> dict:
        return asdict(self)


def render_user_message(template: str, instruction: str, context: str | Sequence[str], question: str) -> str:
    if not isinstance(context, str):
        context = "\n\n".join(context)
    return template.format(instruction=instruction, context=context, question=question)


def build_sample(
    spec: PromptSpec,
    *,
    task: str,
    length: int,
    depth: float | None,
    seed: int,
    index: int,
    answers: list[str],
    evidence: list[str],
    metric: str,
    max_new_tokens: int,
    meta: dict,
) -> EvalSample:
    """The :class:`EvalSample` that asks ``spec`` (its instruction, context, question,
    answer prefix and template, as the generator measured them)."""
    return EvalSample(
        task=task,
        length=length,
        depth=depth,
        seed=seed,
        index=index,
        instruction=spec.instruction,
        context=spec.context,
        question=spec.question,
        answer_prefix=spec.answer_prefix,
        template=spec.template,
        answers=answers,
        evidence=evidence,
        metric=metric,
        max_new_tokens=max_new_tokens,
        meta=meta,
    )


class BudgetError(ValueError):
    """The prompt does not fit the token budget even with the smallest haystack."""


def fit_units(measure: Callable[[int], int], budget: int, lo: int, hi: int, rate_hint: float) -> tuple[int, int]:
    """Largest ``k`` in ``[lo, hi]`` with ``measure(k) <= budget``; returns ``(k, measure(k))``.

    ``measure`` must be (close to) non-decreasing in ``k``. The search starts from a
    proportional estimate (``rate_hint`` tokens per unit), keeps a bracket ``a`` (fits) /
    ``b`` (does not), steps by the remaining slack over the measured rate, and falls back
    to bisection; a typical fit costs 3-6 measurements instead of a full binary search.
    """
    cache: dict[int, int] = {}

    def m(k: int) -> int:
        if k not in cache:
            cache[k] = measure(k)
        return cache[k]

    if m(lo) > budget:
        raise BudgetError(f"the prompt needs {m(lo)} tokens with the smallest haystack ({lo} units); budget {budget}")
    a = lo  # largest known k that fits
    b: int | None = None  # smallest known k that does not fit
    rate = max(float(rate_hint), 1e-6)
    for step in range(200):
        if a >= hi or (b is not None and b - a <= 1):
            break
        guess = a + max(1, int((budget - m(a)) / rate))
        if b is None:
            k = guess if step < 6 else a + max(1, a - lo + 1)  # then grow geometrically
            k = min(k, hi)
        else:
            k = min(max(guess, a + 1), b - 1) if step < 6 else (a + b) // 2
        fits = m(k) <= budget
        if m(k) != m(a):
            rate = max(abs(m(k) - m(a)) / abs(k - a), 1e-6)
        if fits:
            a = k
        else:
            b = k
    else:
        raise RuntimeError(f"fit_units did not converge (bracket {a}..{b}); is measure() non-decreasing?")
    return a, m(a)


def join_items(items: Sequence[tuple[str, str]]) -> tuple[str, list[int]]:
    """Join ``(separator_before, text)`` items (the first separator is dropped); also the
    start offset of every item's text."""
    parts: list[str] = []
    starts: list[int] = []
    pos = 0
    for i, (sep, text) in enumerate(items):
        if i > 0:
            parts.append(sep)
            pos += len(sep)
        starts.append(pos)
        parts.append(text)
        pos += len(text)
    return "".join(parts), starts


def closest_gap(item_lengths: Sequence[int], separators: Sequence[int], joiner_len: int, depth: float) -> int:
    """The gap (0..n) where an inserted item lands closest to relative position ``depth``.

    ``item_lengths[i]`` and ``separators[i]`` (length of the separator before item ``i``,
    ignored for ``i == 0``) describe the text without the insert. An insert at gap ``g``
    is attached with a separator of ``joiner_len`` characters; its relative position is
    ``start / (len(text) + joiner_len)``, which is 0 at gap 0 and 1 at gap n.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    n = len(item_lengths)
    if n == 0:
        return 0
    ends = list(itertools.accumulate((item_lengths[i] + (separators[i] if i else 0)) for i in range(n)))
    total = ends[-1] + joiner_len
    best, best_err = 0, abs(depth)
    for g in range(1, n + 1):
        err = abs((ends[g - 1] + joiner_len) / total - depth)
        if err < best_err:
            best, best_err = g, err
    return best


def relative_position(context: str, evidence: str, start: int | None = None) -> float:
    """Relative position of ``evidence`` in ``context``: 0 at the very start, 1 at the very end."""
    if start is None:
        start = context.find(evidence)
    if start < 0:
        raise ValueError("evidence not found in context")
    span = len(context) - len(evidence)
    return start / span if span > 0 else 0.0
