"""Significance tests on numbers: intervals and p-values for accuracies and paired outcomes.

* Accuracy: Wilson score interval (95 % by default; ``scipy.stats.binomtest(...).proportion_ci``)
  -- well behaved at 0 %, 100 % and small n, unlike the normal approximation.
* Paired difference ``acc(method) - acc(baseline)``: percentile bootstrap over needle
  contents, each resampled with all its pairs (below: outcomes cluster by content;
  ``scipy.stats.bootstrap``, seeded, so a report is reproducible).
* McNemar's exact test: with ``b`` pairs the method got right and the baseline wrong,
  and ``c`` the other way round, ``p = binomtest(b, b + c, 0.5)`` two-sided
  (``scipy.stats.binomtest``); ``p = 1`` when there are no discordant pairs.
* Content-level sign-flip test: outcomes cluster by needle content (one content: the same
  needles, keys and questions at every depth and length), so McNemar's independent pairs
  overstate the evidence when a grid holds a few contents at several depths. The
  per-content sums of the paired differences are sign-flipped (under "no difference" each
  content's sum is symmetric about 0): the exact two-sided p over all ``2**k`` flips, counted
  by convolution when the sums are whole numbers (right / wrong outcomes) and by enumeration
  up to ``k = 16`` otherwise, else a seeded Monte Carlo estimate, which cannot go below
  ``1 / (n_resamples + 1)`` (:func:`content_sign_flip`). With ``k`` contents the smallest
  exact p is ``2 / 2**k`` (6 contents: 0.031).

:mod:`qgpm.eval.stats` applies them to benchmark rows.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["wilson_interval", "bootstrap_ci", "paired_bootstrap_diff", "content_sign_flip", "mcnemar_exact"]


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes out of ``n`` (``(0, 1)`` when ``n == 0``).

    ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``.
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    from scipy.stats import binomtest  # optional: qgpm[eval]

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def _rng(seed: int | str) -> np.random.Generator:
    if isinstance(seed, str):
        seed = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little")
    return np.random.default_rng(seed)


def bootstrap_ci(
    values: Sequence[float],
    *,
    stat: Callable[[np.ndarray], np.ndarray] | None = None,
    n_boot: int = 10_000,
    confidence: float = 0.95,
    seed: int | str = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (or ``stat`` applied along axis 1).

    ``scipy.stats.bootstrap(method="percentile")`` with a generator seeded from ``seed``
    (a string is hashed), so an interval is reproducible. One value gives ``(x, x)``
    (scipy needs two); no value gives NaNs.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1:
        v = float(x[0] if stat is None else np.asarray(stat(x[None, :]))[0])
        return (v, v)
    from scipy.stats import bootstrap  # optional: qgpm[eval]

    if stat is None:
        statistic = np.mean
    else:
        def statistic(sample, axis=-1):
            return stat(np.moveaxis(sample, axis, -1).reshape(-1, sample.shape[axis])).reshape(np.delete(sample.shape, axis))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning when every resample is equal: the interval is that value
        res = bootstrap((x,), statistic, n_resamples=n_boot, confidence_level=confidence, method="percentile",
                        vectorized=True, rng=_rng(seed))
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = 10_000, confidence: float = 0.95, seed: int | str = 0,
    contents: Sequence[Any] | None = None,
) -> tuple[float, float, float]:
    """Mean of ``a - b`` over pairs and its percentile bootstrap interval: resampling pairs, or,
    with ``contents`` (one label per pair), whole contents with all their pairs (outcomes
    cluster by content, so resampling pairs gives too narrow an interval); the statistic is
    then the mean over the pairs of the resampled contents."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError("paired samples need equal lengths")
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    d = x - y
    if contents is None:
        lo, hi = bootstrap_ci(d, n_boot=n_boot, confidence=confidence, seed=seed)
        return (float(d.mean()), lo, hi)
    if len(contents) != d.size:
        raise ValueError(f"paired_bootstrap_diff needs one content per pair, got {len(contents)} and {d.size}")
    ids = {c: i for i, c in enumerate(dict.fromkeys(contents))}
    of = np.array([ids[c] for c in contents])
    sums, counts = np.bincount(of, weights=d), np.bincount(of).astype(np.float64)

    def pooled(resampled: np.ndarray) -> np.ndarray:
        picked = resampled.astype(np.int64)
        return sums[picked].sum(axis=1) / counts[picked].sum(axis=1)

    lo, hi = bootstrap_ci(np.arange(len(ids), dtype=np.float64), stat=pooled, n_boot=n_boot, confidence=confidence, seed=seed)
    return (float(d.mean()), lo, hi)


def content_sign_flip(diffs: Sequence[float], contents: Sequence[Any], *, n_resamples: int = 100_000, seed: int | str = 0) -> float:
    """Two-sided sign-flip p-value of ``sum(diffs)`` with the paired differences grouped by
    ``contents`` (one label per pair; see the module docs). 1.0 when every content's sum is 0."""
    if len(diffs) != len(contents):
        raise ValueError(f"content_sign_flip needs one content per difference, got {len(diffs)} and {len(contents)}")
    sums: dict[Any, float] = {}
    for d, c in zip(diffs, contents):
        sums[c] = sums.get(c, 0.0) + float(d)
    x = np.array([v for v in sums.values() if v != 0.0], dtype=np.float64)
    if x.size == 0:
        return 1.0
    if np.all(x == np.round(x)):  # whole-number sums: the exact distribution of the flipped sum
        return _integer_flip_p(x.astype(np.int64).tolist())
    observed = abs(x.sum()) - 1e-9
    if x.size <= 16:
        signs = 1 - 2 * ((np.arange(2 ** x.size)[:, None] >> np.arange(x.size)) & 1)
        return float(np.mean(np.abs(signs @ x) >= observed))
    signs = _rng(seed).choice(np.array([-1.0, 1.0]), size=(n_resamples, x.size))
    return float((1 + np.sum(np.abs(signs @ x) >= observed)) / (n_resamples + 1))


def _integer_flip_p(sums: list[int]) -> float:
    """Exact two-sided sign-flip p of whole-number content sums: the share of the ``2**k`` sign
    patterns whose flipped total is at least as far from 0 as the observed one, counted over
    the distribution of the flipped total (one convolution per content, exact integers)."""
    counts = {0: 1}
    for v in sums:
        nxt: dict[int, int] = {}
        for total, c in counts.items():
            nxt[total + v] = nxt.get(total + v, 0) + c
            nxt[total - v] = nxt.get(total - v, 0) + c
        counts = nxt
    observed = abs(sum(sums))
    return sum(c for total, c in counts.items() if abs(total) >= observed) / 2 ** len(sums)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts ``b`` and ``c``."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be >= 0")
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest  # optional: qgpm[eval]

    return float(binomtest(int(b), int(b + c), 0.5, alternative="two-sided").pvalue)
