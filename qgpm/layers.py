"""Where a HuggingFace decoder keeps its layers, and the error for a model QGPM cannot modulate.

The smallest module of the package (it imports nothing from it), so that both the rotary
code (:mod:`qgpm.rope`) and the hooks that patch the layers (:mod:`qgpm.hooks`) can use it.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["UnsupportedModelError", "decoder_layers"]


class UnsupportedModelError(ValueError):
    """The model family or its RoPE variant is not supported by QGPM."""


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The decoder layers of ``model`` (``model.base_model.layers``)."""
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no decoder layer list at model.base_model.layers")
    return layers
