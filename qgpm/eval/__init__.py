"""The evaluation harness: runs methods on samples and scores them (:mod:`qgpm.eval.scoring`,
RULER / NoLiMa scorers), writes rows (:mod:`qgpm.eval.runner`, which answers the work items of
:mod:`qgpm.eval.work` with :mod:`qgpm.eval.answering`, hashes each method's settings with
:mod:`qgpm.eval.hashes` and splits the items with :mod:`qgpm.eval.processes`;
:mod:`qgpm.eval.rows` reads and merges them),
statistics and reports (:mod:`qgpm.eval.significance`, :mod:`qgpm.eval.stats`,
:mod:`qgpm.eval.report`), tunes
hyperparameters (:mod:`qgpm.eval.tune`) and holds the evaluation subcommands
(:mod:`qgpm.eval.cli`).

The samples it runs on come from the core package :mod:`qgpm.samples` (offline, seeded task
generators and splits; head calibration uses them too). Their public names are re-exported
here, so ``from qgpm.eval import generate`` keeps working.
"""

from qgpm.eval.scoring import METRICS, is_correct, score
from qgpm.samples.base import SPLIT_SEEDS, SPLITS, EvalSample, split_of_seed, split_seed
from qgpm.samples.tasks import TASKS, generate, sample_prompt

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
    """Lazy access to the harness's entry points ``run_eval``, ``report`` and ``tune``."""
    if name == "run_eval":
        from qgpm.eval.runner import run_eval  # lazy: served like report and tune below, which cannot be imported at module level

        return run_eval
    if name == "report":
        from qgpm.eval.report import report  # lazy: at module level it would rebind qgpm.eval.report from the submodule to the function

        return report
    if name == "tune":
        from qgpm.eval.tune import tune  # lazy: at module level it would rebind qgpm.eval.tune from the submodule to the function

        return tune
    raise AttributeError(name)
