"""qgpm: Query-Guided Positional Modulation for long-context question answering.

QGPM reads the model's own attention heads to rank context sentences against the
question, then remaps RoPE positions so relevant evidence moves closer to the question
on the fast rotary planes. No token is moved or dropped, no weight is trained.

    >>> from qgpm import QGPM
    >>> engine = QGPM.from_pretrained()          # embedded SmolLM2-135M-Instruct
    >>> result = engine.answer(context=text, question="...")
"""

from .baselines import BASELINE_METHODS, STRING_RELEASED_SCALE, LLMLingua2Options, MsPoEOptions, SelfExtendOptions, StringOptions
from .config import PRESETS, QGPMConfig
from .engine import METHODS, ContextTooLongError, QGPM
from .fingerprint import ModelFingerprint
from .heads import HeadSet, HeadSetMismatchError, HeadSetMissingError
from .prompt import EmptyContextError, PromptError
from .results import AnswerStream, QGPMResult, SentenceRelevance, Timings, Usage
from .runtime import SUPPORTED_FAMILIES, UnsupportedModelError
from .settings import ConfidenceRules, MoveRemap, Pass1Settings, ReorderRemap, ShapingSettings, StrideRemap

__all__ = [
    "QGPM",
    "QGPMConfig",
    "Pass1Settings",
    "ShapingSettings",
    "ConfidenceRules",
    "StrideRemap",
    "MoveRemap",
    "ReorderRemap",
    "QGPMResult",
    "SentenceRelevance",
    "Usage",
    "Timings",
    "AnswerStream",
    "METHODS",
    "BASELINE_METHODS",
    "StringOptions",
    "MsPoEOptions",
    "SelfExtendOptions",
    "LLMLingua2Options",
    "STRING_RELEASED_SCALE",
    "PRESETS",
    "HeadSet",
    "HeadSetMissingError",
    "HeadSetMismatchError",
    "ModelFingerprint",
    "ContextTooLongError",
    "PromptError",
    "EmptyContextError",
    "UnsupportedModelError",
    "SUPPORTED_FAMILIES",
]
__version__ = "0.1.0"
