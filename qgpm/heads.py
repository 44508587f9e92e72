"""Head sets: which (layer, head) pairs pass 1 reads, and how they are chosen (App. A).

A head set is stored as JSON (``qgpm/data/heads/<model-name>.json`` for shipped sets)::

    {"model": "SmolLM2-135M-Instruct", "heads": [[layer, head], ...],
     "mrr": [...], "random_mrr": ..., "method": "...", "samples": ..., "created": "..."}

Calibration scores every (layer, head) by the mean reciprocal rank of the evidence
sentence under that head's own sentence signal (Eq. 4 max over tokens of the sentence),
ties counted at the expected rank, and keeps the best ``top`` heads.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

import torch

__all__ = [
    "HeadSet",
    "HeadSetMissingError",
    "load_head_set",
    "stored_head_set_path",
    "reciprocal_rank",
    "user_head_dir",
]


class HeadSetMissingError(LookupError):
    """No head set is stored for this model."""


@dataclass
class HeadSet:
    """Selected heads of one model, best first, with their calibration quality."""

    model: str
    heads: list[tuple[int, int]]
    mrr: list[float] = field(default_factory=list)
    random_mrr: float | None = None
    method: str = ""
    samples: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.heads = [(int(l), int(h)) for l, h in self.heads]
        if not self.heads:
            raise ValueError("a head set needs at least one (layer, head)")
        if len(set(self.heads)) != len(self.heads):
            raise ValueError("a head set lists a head twice")

    @property
    def deepest_layer(self) -> int:
        return max(l for l, _ in self.heads)

    def top(self, k: int | None) -> "HeadSet":
        if k is None or k >= len(self.heads):
            return self
        return HeadSet(self.model, self.heads[:k], self.mrr[:k], self.random_mrr, self.method, self.samples, self.meta)

    def to_json(self) -> str:
        d = asdict(self)
        d["heads"] = [list(h) for h in self.heads]
        return json.dumps(d, indent=1)

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json() + "\n")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "HeadSet":
        d = json.loads(Path(path).read_text())
        return cls(**d)


def _key(model_name: str) -> str:
    return model_name.strip().lower().replace("/", "--")


def user_head_dir() -> Path:
    """Where ``qgpm calibrate`` writes head sets for the user (``$QGPM_HOME/heads``)."""
    home = os.environ.get("QGPM_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "qgpm")
    return Path(home) / "heads"


def stored_head_set_path(model_name: str) -> Path | None:
    """The stored head-set file for ``model_name``: user folder first, then package data."""
    name = _key(model_name) + ".json"
    user = user_head_dir() / name
    if user.is_file():
        return user
    shipped = resources.files("qgpm") / "data" / "heads" / name
    if shipped.is_file():
        return Path(str(shipped))
    return None


def load_head_set(model_name: str) -> HeadSet:
    """Load the stored head set of ``model_name`` or raise :class:`HeadSetMissingError`."""
    path = stored_head_set_path(model_name)
    if path is None:
        raise HeadSetMissingError(
            f"no head set is stored for model '{model_name}'. Calibrate one with "
            f"`qgpm calibrate --model <id-or-path>` (writes to {user_head_dir()}), call "
            "QGPM.from_pretrained(..., heads='calibrate') to calibrate now, or pass heads=[(layer, head), ...]."
        )
    return HeadSet.load(path)


def reciprocal_rank(scores: torch.Tensor, gold: Iterable[int]) -> float:
    """1 / rank of the best gold unit under ``scores`` (higher = better), ties at expected rank.

    With ``a`` units scoring strictly higher than the best gold unit and ``t`` other
    units tied with it, the expected rank is ``a + 1 + t / 2``.
    """
    gold = list(gold)
    if not gold:
        raise ValueError("reciprocal_rank needs at least one gold index")
    s = scores.to(torch.float64)
    best = max(float(s[g]) for g in gold)
    higher = int((s > best).sum())
    ties = int((s == best).sum()) - 1
    return 1.0 / (higher + 1 + ties / 2)
