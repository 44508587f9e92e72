"""RULER tasks: needle-in-a-haystack (``niah_*``) and multi-document QA (``qa_1``, ``qa_2``).

Facts taken from RULER (NVIDIA/RULER, ``scripts/data/synthetic/{niah,qa,constants}.py``,
``scripts/synthetic.yaml``, ``scripts/eval/synthetic/constants.py``); the code is ours.

NIAH
  * Needle: ``"One of the special magic numbers for {key} is: {value}."`` (the needle
    always says "numbers"). Keys are "adjective-noun" pairs from wonderwords' lists;
    values are random 7-digit numbers.
  * Prompt (task template + answer prefix): ``"Some special magic numbers are hidden within
    the following text. Make sure to memorize it. I will quiz you about the numbers
    afterwards.\\n{context}\\nWhat are all the special magic numbers for {query} mentioned
    in the provided text?"`` then ``" The special magic numbers for {query} mentioned in the
    provided text are"``. When a single value is asked (queries x values == 1) RULER turns
    it singular: "A special magic number is hidden ...", "What is the special magic number
    ...", "... is". We keep the answer prefix without its leading space, since it follows
    the assistant tag.
  * Essay haystack: all essays, whitespace collapsed, split into words; the first ``k``
    words (``k`` fitted to the budget), split into sentences (punkt in RULER; here
    :func:`qgpm.segment.split_sentences`), needles inserted between sentences at sentence
    index ``int(n_sentences * depth / 100)``, depths drawn without replacement from
    ``round(linspace(0, 100, 40))``; sentences and needles joined by spaces.
  * Needle haystack (``niah_multikey_2``): ``k`` needles with other random keys and values,
    one per line; the queried needle is inserted at a random line index.
  * Configs: ``niah_single_2`` essay, 1 key, 1 value; ``niah_multikey_1`` essay, 4 keys
    (one asked); ``niah_multikey_2`` needle haystack; ``niah_multivalue`` essay, 1 key with 4
    values (all asked). 128 tokens to generate. Metric ``string_match_all``.

QA
  * Documents are formatted ``"Document {i}:\\n{document}"`` (1-based) and joined by blank
    lines. SQuAD: the question's paragraph, then the other paragraphs of its article, then
    random other paragraphs. HotpotQA: all ten paragraphs of the question (its two gold
    paragraphs and eight distractors), then random other paragraphs
    (``"title\\n" + "".join(sentences)``). RULER shuffles all documents.
  * Prompt: ``"Answer the question based on the given documents. Only give me the answer and
    do not output any other words.\\n\\nThe following are given documents.\\n\\n{context}\\n\\n
    Answer the question based on the given documents. Only give me the answer and do not
    output any other words.\\n\\nQuestion: {query}"`` + answer prefix ``" Answer:"``. 32
    tokens to generate. Metric ``string_match_part``.

Beyond RULER
  * ``depth``: with a depth in [0, 1] the queried needle (``niah_multivalue``: its first
    value's needle) is put at the sentence boundary whose relative character position is
    closest to ``depth``; the other needles keep RULER's random placement. For QA the gold
    document(s) go at document index ``round(depth * (n_docs - n_gold))`` (HotpotQA's two
    gold documents as one adjacent block) and the distractors keep their random order.
  * The token budget is fitted per sample by search on the haystack size, on the full
    chat-templated prompt (see :func:`qgpm.prompt.count_prompt_tokens`).
  * Keys (NIAH) and questions (QA: SQuAD by article, HotpotQA by question) are partitioned
    across the calibration / dev / test splits.
  * At small budgets HotpotQA may keep fewer than its eight own distractors (RULER would
    fail); ``meta["num_docs"]`` records what was used.
  * NIAH tasks on the essay haystack accept ``haystack=`` another source (e.g. ``"squad"``):
    its paragraphs, rotated to a random start paragraph per sample, replace the essays.
"""

from __future__ import annotations

from typing import Any, Sequence

from qgpm.samples import resources
from qgpm.samples.base import (
    EvalSample,
    build_sample,
    closest_gap,
    fit_units,
    sample_rng,
    split_of_seed,
    split_pool,
)
from qgpm.prompt import PromptSpec, count_prompt_tokens
from qgpm.segment import split_sentences

__all__ = ["NIAH_TASKS", "QA_TASKS", "RULER_DEPTHS", "NEEDLE", "generate_niah", "generate_qa"]

NEEDLE = "One of the special magic numbers for {key} is: {value}."

# RULER: np.round(np.linspace(0, 100, num=40)) as integers.
RULER_DEPTHS: tuple[int, ...] = tuple(int(round(100 * i / 39 + 1e-9)) for i in range(40))

NIAH_TASKS: dict[str, dict[str, Any]] = {
    "niah_single_2": {"haystack": "essay", "num_k": 1, "num_v": 1},
    "niah_multikey_1": {"haystack": "essay", "num_k": 4, "num_v": 1},
    "niah_multikey_2": {"haystack": "needle", "num_k": 1, "num_v": 1},
    "niah_multivalue": {"haystack": "essay", "num_k": 1, "num_v": 4},
}
NIAH_MAX_NEW_TOKENS = 128

QA_TASKS: dict[str, str] = {"qa_1": "squad", "qa_2": "hotpotqa"}
QA_MAX_NEW_TOKENS = 32

_NIAH_TEMPLATE = "{instruction}\n{context}\n{question}"
_QA_INSTRUCTION = "Answer the question based on the given documents. Only give me the answer and do not output any other words."
_QA_TEMPLATE = "{instruction}\n\nThe following are given documents.\n\n{context}\n\n{instruction}\n\nQuestion: {question}"
_QA_ANSWER_PREFIX = "Answer:"


def _niah_texts(query: str, plural: bool) -> tuple[str, str, str]:
    """(instruction, question, answer_prefix) of RULER's NIAH prompt."""
    if plural:
        return (
            "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.",
            f"What are all the special magic numbers for {query} mentioned in the provided text?",
            f"The special magic numbers for {query} mentioned in the provided text are",
        )
    return (
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.",
        f"What is the special magic number for {query} mentioned in the provided text?",
        f"The special magic number for {query} mentioned in the provided text is",
    )


def _number(rng) -> str:
    return str(rng.randint(10**6, 10**7 - 1))


class _KeyDrawer:
    """Distinct "adjective-noun" keys and distinct 7-digit values from one stream."""

    def __init__(self, rng, split: str):
        self.rng = rng
        self.adjs, self.nouns = resources.key_words(split)
        self.keys: set[str] = set()
        self.values: set[str] = set()

    def key(self) -> str:
        while True:
            k = f"{self.rng.choice(self.adjs)}-{self.rng.choice(self.nouns)}"
            if k not in self.keys:
                self.keys.add(k)
                return k

    def value(self) -> str:
        while True:
            v = _number(self.rng)
            if v not in self.values:
                self.values.add(v)
                return v


class _NeedleStream:
    """The needle haystack: an endless, deterministic list of needles with fresh keys."""

    def __init__(self, drawer: _KeyDrawer):
        self.drawer = drawer
        self.lines: list[str] = []

    def take(self, k: int) -> list[str]:
        while len(self.lines) < k:
            self.lines.append(NEEDLE.format(key=self.drawer.key(), value=self.drawer.value()))
        return self.lines[:k]


def _rotated_words(name: str, source, rng) -> list[str]:
    paras = resources.haystack_sentences(name, source)
    start = rng.randrange(len(paras))
    words: list[str] = []
    for p in paras[start:] + paras[:start]:
        for s in p:
            words.extend(s.split())
    return words


def _place(items: list[str], inserts: Sequence[tuple[str, int]]) -> list[str]:
    """Insert ``(text, gap)`` pairs (gaps index the original ``items``), keeping their order."""
    by_gap: dict[int, list[str]] = {}
    for text, gap in inserts:
        by_gap.setdefault(gap, []).append(text)
    out: list[str] = []
    for g in range(len(items) + 1):
        out.extend(by_gap.get(g, ()))
        if g < len(items):
            out.append(items[g])
    return out


def _depths_of(context: str, needles: Sequence[str]) -> list[float]:
    span = len(context)
    out = []
    for nd in needles:
        start = context.find(nd)
        out.append(start / max(span - len(nd), 1))
    return out


def generate_niah(
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
    cfg = NIAH_TASKS[task]
    split = split_of_seed(seed)
    max_new = NIAH_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    budget = length - max_new
    if cfg["haystack"] == "needle" and haystack is not None:
        raise ValueError(f"{task} uses the needle haystack; 'haystack' does not apply")
    out: list[EvalSample] = []
    for depth in (list(depths) if depths is not None else [None]):
        for i in range(n):
            out.append(_one_niah(task, cfg, split, seed, i, depth, length, budget, max_new, tokenizer, haystack))
    return out


def _one_niah(task, cfg, split, seed, i, depth, length, budget, max_new, tokenizer, haystack) -> EvalSample:
    num_k, num_v = cfg["num_k"], cfg["num_v"]
    content = sample_rng(task, seed, i, "content")
    drawer = _KeyDrawer(content, split)
    keys = [drawer.key() for _ in range(num_k)]
    values = [[drawer.value() for _ in range(num_v)] for _ in keys]
    q = content.randrange(num_k)
    query = keys[q]
    answers = list(values[q])
    evidence = [NEEDLE.format(key=query, value=v) for v in answers]
    others = [NEEDLE.format(key=keys[j], value=v) for j in range(num_k) if j != q for v in values[j]]
    instruction, question, answer_prefix = _niah_texts(query, plural=num_v > 1)

    layout = sample_rng(task, seed, i, depth, "layout")
    if depth is None:
        randomly_placed = list(evidence) + others
        target = None
    else:
        randomly_placed = list(evidence[1:]) + others
        target = evidence[0]
    layout.shuffle(randomly_placed)
    grid = sorted(layout.sample(RULER_DEPTHS, len(randomly_placed)))
    line_u = layout.random()  # needle haystack: RULER's random line index

    if cfg["haystack"] == "needle":
        stream = _NeedleStream(_KeyDrawer(sample_rng(task, seed, i, "haystack"), split))
        stream.drawer.keys.update(keys)
        stream.drawer.values.update(v for vs in values for v in vs)
        hay_name = "needle"

        def build(k: int) -> str:
            lines = list(stream.take(k))
            if target is None:
                lines.insert(int(line_u * k), evidence[0])
            else:
                lines.insert(closest_gap([len(x) for x in lines], [1] * len(lines), 1, depth), target)
            return "\n".join(lines)

        lo, hi, rate = 0, 10**7, 20.0
    else:
        if haystack is None or haystack == "essays":
            hay_name, words = "essays", resources.essay_words()
        else:
            hay_name, source = resources.get_haystack(haystack)
            words = _rotated_words(hay_name, source, sample_rng(task, seed, i, "haystack"))

        def build(k: int) -> str:
            sents = [s.text for s in split_sentences(" ".join(words[:k]).strip())]
            ns = len(sents)
            items = _place(sents, [(t, int(ns * d / 100)) for t, d in zip(randomly_placed, grid)])
            if target is not None:
                items.insert(closest_gap([len(x) for x in items], [1] * len(items), 1, depth), target)
            return " ".join(items)

        lo, hi, rate = 1, len(words), 1.3

    def prompt(k: int) -> PromptSpec:
        return PromptSpec(context=build(k), question=question, instruction=instruction, answer_prefix=answer_prefix, template=_NIAH_TEMPLATE)

    def measure(k: int) -> int:
        return count_prompt_tokens(tokenizer, prompt(k)) + max_new

    k, total = fit_units(measure, length, lo, hi, rate)
    spec = prompt(k)
    context = spec.context
    meta = {
        "split": split,
        "haystack": hay_name,
        "haystack_units": k,
        "prompt_tokens": total - max_new,
        "query_key": query,
        "keys": keys,
        "needle_depths": _depths_of(context, evidence),
        "distractor_needles": others,
        "distractor_depths": _depths_of(context, others),
    }
    return build_sample(spec, task=task, length=length, depth=depth, seed=seed, index=i, max_new_tokens=max_new,
                        answers=answers, evidence=evidence, metric="string_match_all", meta=meta)


# ---------------------------------------------------------------------------- QA


def generate_qa(
    task: str,
    *,
    n: int,
    length: int,
    tokenizer: Any,
    seed: int,
    depths: Sequence[float] | None = None,
    max_new_tokens: int | None = None,
) -> list[EvalSample]:
    dataset = QA_TASKS[task]
    split = split_of_seed(seed)
    max_new = QA_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    items, docs = resources.load_squad() if dataset == "squad" else resources.load_hotpotqa()
    groups = sorted({it.group for it in items})
    mine = set(split_pool(groups, split))
    pool = [it for it in items if it.group in mine]
    order = sample_rng(task, seed, "questions").sample(range(len(pool)), len(pool))
    out = []
    for depth in (list(depths) if depths is not None else [None]):
        if depth is not None and not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        for i in range(n):
            item = pool[order[i % len(pool)]]
            out.append(_one_qa(task, dataset, item, docs, split, seed, i, depth, length, max_new, tokenizer))
    return out


def _one_qa(task, dataset, item, docs, split, seed, i, depth, length, max_new, tokenizer) -> EvalSample:
    content = sample_rng(task, seed, i, "content")
    related = list(item.related)
    content.shuffle(related)
    taken = set(item.gold) | set(related)
    cap = min(len(docs), max(400, length // 15))
    others = [d for d in content.sample(range(len(docs)), min(len(docs), cap + len(taken))) if d not in taken][:cap]
    candidates = related + others
    gold = list(item.gold)
    layout = sample_rng(task, seed, i, depth, "layout")
    layout.shuffle(gold)
    sort_key = {d: layout.random() for d in gold + candidates}  # RULER's shuffle, stable under k
    ng = len(gold)

    def doc_order(dis: list[int]) -> list[int]:
        if depth is None:
            return sorted(gold + dis, key=sort_key.__getitem__)
        p = round(depth * len(dis))
        return dis[:p] + gold + dis[p:]

    def build(dis: list[int]) -> str:
        return "\n\n".join(f"Document {j + 1}:\n{docs[d]}" for j, d in enumerate(doc_order(dis)))

    def prompt(dis: list[int]) -> PromptSpec:
        return PromptSpec(context=build(dis), question=item.question, instruction=_QA_INSTRUCTION, answer_prefix=_QA_ANSWER_PREFIX, template=_QA_TEMPLATE)

    def measure_dis(dis: list[int]) -> int:
        return count_prompt_tokens(tokenizer, prompt(dis)) + max_new

    avg = sum(len(docs[d]) for d in candidates[:20]) / max(1, min(20, len(candidates))) / 4.0 + 5
    k, total = fit_units(lambda k: measure_dis(candidates[: k - ng]), length, ng, ng + len(candidates), avg)
    dis = candidates[: k - ng]
    # Documents are coarse units: top up the slack with later candidates that still fit.
    tries = 0
    for c in candidates[k - ng :]:
        slack = length - total
        if slack < 24 or tries >= 6:
            break
        if len(tokenizer(docs[c], add_special_tokens=False)["input_ids"]) + 8 > slack:
            continue
        tries += 1
        t = measure_dis(dis + [c])
        if t <= length:
            dis, total = dis + [c], t
    k = ng + len(dis)
    order = doc_order(dis)
    spec = prompt(dis)
    context = spec.context
    evidence = [docs[d] for d in gold]
    meta = {
        "split": split,
        "dataset": dataset,
        "group": item.group,
        "num_docs": k,
        "gold_positions": [order.index(d) for d in gold],
        "gold_doc_depths": [order.index(d) / max(1, k - 1) for d in gold],
        "num_related_docs": sum(1 for d in order if d in set(item.related)),
        "prompt_tokens": total - max_new,
        "needle_depths": _depths_of(context, evidence),
    }
    return build_sample(spec, task=task, length=length, depth=depth, seed=seed, index=i, max_new_tokens=max_new,
                        answers=list(item.answers), evidence=evidence, metric="string_match_part", meta=meta)
