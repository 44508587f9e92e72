"""Statistics for benchmark rows: accuracy with confidence intervals and paired tests.

Every method answers the same samples, so comparisons against the baseline (vanilla)
are *paired*: a pair is one sample (task, length, depth, seed) answered by both. The tests
themselves (Wilson interval, content bootstrap, McNemar, content sign-flip) live in
:mod:`qgpm.eval.significance`.

A sample's needle content is its seed (the same seed gives the same needles, keys and
questions at every depth and length). Where two seeds draw the same question (NoLiMa contents
draw their needle template per seed, with replacement) a row's ``question_id`` names it, and
the rows of one question form one content.

Rows are the dicts the runner writes (``task``, ``length``, ``depth``, ``seed``,
``method``, ``config_hash``, ``correct``, ``score``, ``logprob_gold``, ``error``).
Rows with an ``error`` are left out of every statistic and counted separately.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from qgpm.eval.rows import dedupe_rows
from qgpm.eval.significance import content_sign_flip, mcnemar_exact, paired_bootstrap_diff, wilson_interval

__all__ = [
    "base_for",
    "content_of",
    "Accuracy",
    "Paired",
    "accuracy",
    "paired",
    "pair_key",
    "series_labels",
    "group_accuracy",
    "group_paired",
    "summarize",
]


@dataclass
class Accuracy:
    """Accuracy of one series over some rows."""

    n: int
    correct: int
    acc: float
    lo: float
    hi: float
    mean_score: float
    mean_logprob: float | None
    errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Paired:
    """A method against the baseline on the samples both answered."""

    n: int
    acc: float
    base_acc: float
    diff: float
    lo: float
    hi: float
    b: int  # method right, baseline wrong
    c: int  # baseline right, method wrong
    p: float
    logprob_diff: float | None = None
    contents: int = 0  # distinct needle contents among the pairs (seeds, or questions where rows name them)
    content_p: float = 1.0  # sign-flip p over the contents' summed differences

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ok(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if not r.get("error")]


def accuracy(rows: Sequence[dict], confidence: float = 0.95) -> Accuracy:
    """Accuracy (``correct``), Wilson interval, mean ``score`` and mean gold log-prob."""
    good = _ok(rows)
    n = len(good)
    k = sum(1 for r in good if r["correct"])
    lo, hi = wilson_interval(k, n, confidence)
    lps = [r["logprob_gold"] for r in good if r.get("logprob_gold") is not None]
    return Accuracy(
        n=n, correct=k, acc=k / n if n else math.nan, lo=lo, hi=hi,
        mean_score=float(np.mean([r["score"] for r in good])) if n else math.nan,
        mean_logprob=float(np.mean(lps)) if lps else None,
        errors=len(rows) - n,
    )


def pair_key(r: dict) -> tuple:
    """The sample a row answers, ``(task, length, depth, seed)``: rows of two methods with
    the same key are a pair."""
    d = r.get("depth")
    return (r["task"], int(r["length"]), None if d is None else round(float(d), 6), int(r["seed"]))


def content_of(row: dict) -> tuple:
    """The content a row's outcome clusters by: its question where the row names one
    (``question_id``: NoLiMa's needle template), else its seed (the same needles, keys and
    questions at every depth and length)."""
    if row.get("question_id") is not None:
        return (row["task"], "question", row["question_id"])
    return (row["task"], int(row["seed"]))


def paired(rows: Sequence[dict], base_rows: Sequence[dict], *, n_boot: int = 10_000, confidence: float = 0.95, seed: int | str = 0) -> Paired:
    """Pair ``rows`` with ``base_rows`` by sample and compare (see module docs). A sample answered
    twice by one series counts once (:func:`~qgpm.eval.rows.dedupe_rows`: a success beats an
    error, a later row an earlier one)."""
    return _paired(dedupe_rows(rows), dedupe_rows(base_rows), n_boot=n_boot, confidence=confidence, seed=seed)


def _paired(rows: Sequence[dict], base_rows: Sequence[dict], *, n_boot: int, confidence: float, seed: int | str) -> Paired:
    """:func:`paired` over rows already deduplicated."""
    base = {pair_key(r): r for r in _ok(base_rows)}
    pairs = [(r, base[pair_key(r)]) for r in _ok(rows) if pair_key(r) in base]
    a = [float(r["correct"]) for r, _ in pairs]
    v = [float(q["correct"]) for _, q in pairs]
    contents = [content_of(r) for r, _ in pairs]
    diff, lo, hi = paired_bootstrap_diff(a, v, n_boot=n_boot, confidence=confidence, seed=seed, contents=contents)
    b = sum(1 for r, q in pairs if r["correct"] and not q["correct"])
    c = sum(1 for r, q in pairs if q["correct"] and not r["correct"])
    lp = [r["logprob_gold"] - q["logprob_gold"] for r, q in pairs if r.get("logprob_gold") is not None and q.get("logprob_gold") is not None]
    n = len(pairs)
    return Paired(
        n=n, acc=float(np.mean(a)) if n else math.nan, base_acc=float(np.mean(v)) if n else math.nan,
        diff=diff, lo=lo, hi=hi, b=b, c=c, p=mcnemar_exact(b, c),
        logprob_diff=float(np.mean(lp)) if lp else None,
        contents=len(set(contents)), content_p=content_sign_flip([x - y for x, y in zip(a, v)], contents, seed=seed),
    )


# ----------------------------------------------------------------------------- grouping


def series_labels(rows: Sequence[dict]) -> dict[tuple[str, str], str]:
    """``(method, config_hash) -> label``: the method name, or ``method@hash6`` when one
    method appears with several configurations."""
    seen: dict[str, list[str]] = {}
    for r in rows:
        hs = seen.setdefault(r["method"], [])
        if r["config_hash"] not in hs:
            hs.append(r["config_hash"])
    out = {}
    for m, hs in seen.items():
        for h in hs:
            out[(m, h)] = m if len(hs) == 1 else f"{m}@{h[:6]}"
    return out


def _label(r: dict, labels: dict) -> str:
    return labels[(r["method"], r["config_hash"])]


def group_accuracy(rows: Sequence[dict], by: Sequence[str], *, labels: dict | None = None, confidence: float = 0.95) -> dict[tuple, Accuracy]:
    """Accuracy per ``by`` fields (e.g. ``("task", "length")``) and series label.

    Keys are ``(*values_of_by, label)``. A ``by`` field ``"*"`` is a literal ``"all"``. A sample
    answered twice by one series counts once (:func:`~qgpm.eval.rows.dedupe_rows`).
    """
    labels = labels or series_labels(rows)
    groups: dict[tuple, list[dict]] = {}
    for r in dedupe_rows(rows):
        key = tuple("all" if f == "*" else r.get(f) for f in by) + (_label(r, labels),)
        groups.setdefault(key, []).append(r)
    return {k: accuracy(v, confidence) for k, v in groups.items()}


logger = logging.getLogger("qgpm")
_WARNED_BASE: set[tuple] = set()  # (series, baseline configs) said once per process
METHOD_FIELDS = frozenset({"method", "config", "heads", "calibrated_min_top_z", "pass1_precision", "reranker", "k", "options"})
"""The fields of :func:`qgpm.eval.hashes.method_fingerprint` that some methods record and others
do not; pairing a series with a baseline config compares the others (model, dtype, answer
budget, haystack, stop, generator)."""


def base_for(label: str, base_labels: Sequence[str], labels: dict, configs: Mapping[str, dict] | None) -> str:
    """The baseline series ``label`` is paired with: the baseline config whose fingerprint
    (``configs``: config hash -> the manifest's fingerprint) agrees with the series' own on the
    fields every method records (stop, max_new_tokens, model, dtype, haystack, generator: all but
    :data:`METHOD_FIELDS`) and on those of :data:`METHOD_FIELDS` both record (``k`` of two Top-K
    configs). Where none or several agree, the first, with a warning (logger ``qgpm``, once per
    series) naming the choice; with one baseline config, that one, with a warning naming the
    fields that differ where it was run otherwise (another answer budget, model or dtype)."""
    differ: dict[str, list[str]] = {}
    if configs:
        hash_of = {lab: h for (_, h), lab in labels.items()}
        common = {k for b in base_labels for k in configs.get(hash_of.get(b, ""), {})} - METHOD_FIELDS  # every method records these
        own = configs.get(hash_of.get(label, ""), {})
        for b in base_labels:  # a method's own field counts where both record it (vanilla has no reranker, no k)
            fp = configs.get(hash_of.get(b, ""), {})
            keys = common | ((set(own) & set(fp)) - {"method"})
            differ[b] = sorted(k for k in keys if own and own.get(k) != fp.get(k))
    matches = [b for b in base_labels if configs and not differ[b]]
    if len(matches) == 1:
        return matches[0]
    if (label, tuple(base_labels)) not in _WARNED_BASE:
        _WARNED_BASE.add((label, tuple(base_labels)))
        if len(base_labels) == 1 and configs:
            logger.warning("qgpm: %s is paired with %s, which was run with other settings (%s differ): its wins and losses "
                           "compare more than the method; run the baseline as the series was run", label, base_labels[0],
                           ", ".join(differ[base_labels[0]]))
        elif len(base_labels) > 1:
            why = "no fingerprints given" if not configs else f"{len(matches)} of their fingerprints match its own"
            logger.warning("qgpm: %s is paired with %s, the first of the baseline configs %s (%s); pass one of those labels "
                           "as --baseline to choose", label, base_labels[0], ", ".join(base_labels), why)
    return base_labels[0]


def group_paired(
    rows: Sequence[dict], by: Sequence[str], *, baseline: str = "vanilla", labels: dict | None = None,
    n_boot: int = 10_000, confidence: float = 0.95, seed: int | str = 0, configs: Mapping[str, dict] | None = None,
) -> dict[tuple, Paired]:
    """Paired comparison of every series against ``baseline`` per ``by`` group.

    Keys are ``(*values_of_by, label)``; the baseline series itself is left out. With several
    baseline configs each series is paired with the one run as it was (:func:`base_for`). The
    bootstrap seed is derived from ``seed`` and the group key, so a group's interval does
    not depend on which other groups exist.
    """
    labels = labels or series_labels(rows)
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in dedupe_rows(rows):  # once: each group's series are then deduplicated already
        key = tuple("all" if f == "*" else r.get(f) for f in by)
        groups.setdefault(key, {}).setdefault(_label(r, labels), []).append(r)
    out: dict[tuple, Paired] = {}
    for key, series in groups.items():
        base_labels = [lab for lab in series if lab == baseline or lab.startswith(baseline + "@")]
        if not base_labels:
            continue
        for lab, rs in series.items():
            if lab in base_labels:
                continue
            base = series[base_for(lab, base_labels, labels, configs)]
            out[key + (lab,)] = _paired(rs, base, n_boot=n_boot, confidence=confidence, seed=f"{seed}|{key}|{lab}")
    return out


def summarize(rows: Sequence[dict], *, baseline: str = "vanilla", n_boot: int = 10_000, confidence: float = 0.95, seed: int = 0,
              configs: Mapping[str, dict] | None = None) -> dict[str, Any]:
    """Everything the report shows, as plain dicts (also written to ``stats.json``); ``configs``:
    the manifest's fingerprints, which pair each series with its own baseline config."""
    labels = series_labels(rows)
    kw = dict(labels=labels, confidence=confidence)
    pk = dict(baseline=baseline, labels=labels, n_boot=n_boot, confidence=confidence, seed=seed, configs=configs)

    def flat(d: dict, names: Sequence[str]) -> list[dict]:
        return [dict(zip(names, k), **v.to_dict()) for k, v in d.items()]

    return {
        "labels": sorted(set(labels.values())),
        "accuracy": flat(group_accuracy(rows, ("task", "length"), **kw), ("task", "length", "series")),
        "accuracy_all": flat(group_accuracy(rows, ("*", "length"), **kw), ("task", "length", "series")),
        "accuracy_depth": flat(group_accuracy(rows, ("task", "length", "depth"), **kw), ("task", "length", "depth", "series")),
        "paired": flat(group_paired(rows, ("task", "length"), **pk), ("task", "length", "series")),
        "paired_all": flat(group_paired(rows, ("*", "length"), **pk), ("task", "length", "series")),
        "paired_depth": flat(group_paired(rows, ("task", "length", "depth"), **pk), ("task", "length", "depth", "series")),
    }
