"""Benchmarks for qgpm: offline task generators (:mod:`qgpm.eval.tasks`) and scorers
(:mod:`qgpm.eval.scoring`)."""

from qgpm.eval.base import SPLIT_SEEDS, SPLITS, EvalSample, split_of_seed, split_seed
from qgpm.eval.scoring import METRICS, is_correct, score
from qgpm.eval.tasks import TASKS, generate, sample_prompt

__all__ = [
    "EvalSample",
    "TASKS",
    "generate",
    "sample_prompt",
    "SPLITS",
    "SPLIT_SEEDS",
    "split_seed",
    "split_of_seed",
    "METRICS",
    "score",
    "is_correct",
]


def __getattr__(name: str):
    """Lazy access to the harness (it imports accelerate/matplotlib only when used)."""
    if name == "run_eval":
        from qgpm.eval.runner import run_eval

        return run_eval
    if name == "report":
        from qgpm.eval.report import report

        return report
    if name == "tune":
        from qgpm.eval.tune import tune

        return tune
    raise AttributeError(name)
