"""A pass-1 model: only the decoder layers pass 1 reads, for an engine that generates elsewhere.

When pass 2 and decoding run on a server (:class:`qgpm.serving.VLLMServer`), this process runs
only pass 1, which stops at the deepest selected head's layer. :func:`load_pass1_model` loads
the first ``deepest + 1`` decoder layers and nothing below them is ever allocated. The order is
config -> fingerprint -> head set -> weights: the head set is found by the model's fingerprint,
which the config and the tokenizer give (:func:`qgpm.loading.source_fingerprint`), before any
weight is read.

The loaded model keeps the full model's config under :data:`FULL_CONFIG_ATTR`, so its
fingerprint (and with it the stored head set and config preset) and the layer count the plan
is built for are the full model's. Everything that needs the missing layers (generation in
this process, ``score=``, ``answer_logprob``, head calibration, heads in layers not loaded)
raises :class:`LayersNotLoadedError` before any work.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Sequence

import torch

from .config import QGPMConfig
from .fingerprint import FULL_CONFIG_ATTR
from .heads import HeadSet, HeadSetMissingError, choose_head_set
from .loading import ModelSource, load_model, model_config, source_fingerprint
from .runtime import decoder_layers
from .sources import parse_source

logger = logging.getLogger("qgpm")

__all__ = ["LayersNotLoadedError", "load_pass1_model", "pass1_depth", "full_layers", "loaded_layers", "is_partial",
           "weight_bytes_not_loaded", "NoLocalGenerator", "full_rotary", "check_pass1_layers_only", "check_heads_fit"]


class LayersNotLoadedError(ValueError):
    """A call needs decoder layers this engine did not load (it holds pass 1's layers only):
    a setting of the engine (``pass1_layers_only``) or of the call must change."""


def is_partial(model: torch.nn.Module) -> bool:
    """Whether ``model`` was loaded by :func:`load_pass1_model` (fewer layers than its checkpoint)."""
    return getattr(model, FULL_CONFIG_ATTR, None) is not None


def full_layers(model: torch.nn.Module) -> int:
    """The checkpoint's decoder-layer count (the loaded count for a whole model)."""
    return int((getattr(model, FULL_CONFIG_ATTR, None) or model.config).num_hidden_layers)


def loaded_layers(model: torch.nn.Module) -> int:
    """The decoder layers this process holds."""
    return int(model.config.num_hidden_layers)


def check_heads_fit(heads: Sequence[tuple[int, int]], model: torch.nn.Module, *, loaded: bool = False) -> None:
    """Raise ``ValueError`` for heads outside the checkpoint and, with ``loaded``, :class:`LayersNotLoadedError`
    for heads below the layers ``model`` holds (a call about to run pass 1 on them)."""
    n_layers, n_loaded, n_heads = full_layers(model), loaded_layers(model), model.config.num_attention_heads
    bad = [h for h in heads if not (0 <= h[0] < n_layers and 0 <= h[1] < n_heads)]
    if bad:
        raise ValueError(f"heads {bad} are outside this model ({n_layers} layers x {n_heads} heads)")
    deep = [h for h in heads if h[0] >= n_loaded] if loaded else []
    if deep:
        raise LayersNotLoadedError(
            f"pass 1 over heads {deep} needs decoder layers this engine did not load: it holds {n_loaded} of {n_layers}, "
            "the layers its config read when it loaded (pass1_layers_only, the default with a remote generator). Load the "
            "engine with the config these calls use (from_pretrained(..., config=...)), or with pass1_layers_only=False")


def pass1_depth(heads: Sequence[tuple[int, int]] | None, config: QGPMConfig) -> int:
    """How many decoder layers pass 1 reads for ``heads`` under ``config``: the deepest head's
    layer + 1; 1 with no heads or a relevance source without them (vanilla, the rerankers and a
    reranker source read no layer; the engine still needs a model for its checks)."""
    return max(layer for layer, _ in heads) + 1 if heads and parse_source(config.relevance).heads else 1


def check_pass1_layers_only(value: Any, generator: Any) -> bool:
    """``pass1_layers_only`` resolved (``None``: ``True`` exactly when ``generator`` is given) and
    checked: a model without every layer needs a generator that runs them elsewhere."""
    if value is None:
        return generator is not None
    if not isinstance(value, bool):
        raise TypeError(f"pass1_layers_only must be True, False or None, got {value!r}")
    if value and generator is None:
        raise ValueError("a model with pass 1's layers only needs generator= (a remote generator, e.g. qgpm.serving.VLLMServer, "
                         "runs the layers this process leaves out); pass pass1_layers_only=False to load every layer")
    return value


def load_pass1_model(source: ModelSource, heads: Any, config: QGPMConfig | None = None, *, dtype: Any = None, device_map: Any = None,
                     **kwargs: Any) -> tuple[torch.nn.Module, Any]:
    """``(model, head set or None)``: ``source`` loaded with only the decoder layers pass 1 reads
    under ``config`` (``None``: the model's preset or the recipe, :meth:`QGPMConfig.for_model`)
    with its head set (``heads`` as :meth:`qgpm.QGPM.from_pretrained` takes them). Raises
    :class:`LayersNotLoadedError` for ``heads="calibrate"`` (calibration reads every layer) before any weight loads."""
    if isinstance(heads, str) and heads == "calibrate":
        raise LayersNotLoadedError("heads='calibrate' reads every layer, and this engine loads only pass 1's (pass1_layers_only): calibrate "
                         "once with the whole model (`qgpm calibrate`, or pass1_layers_only=False) and load again; the stored set is found")
    if "config" in kwargs:
        raise ValueError("config= goes to from_pretrained of a whole model; with pass1_layers_only the layer count is set from the heads")
    fp = source_fingerprint(source)
    hs = choose_head_set(heads, fp, source.name)
    head_set = None if isinstance(hs, HeadSetMissingError) else hs
    full = model_config(source)
    config = config or QGPMConfig.for_model(fp.key)
    depth = min(pass1_depth(head_set.heads if isinstance(head_set, HeadSet) else None, config), full.num_hidden_layers)
    cut = copy.deepcopy(full)
    cut.num_hidden_layers = depth
    if getattr(cut, "layer_types", None) is not None:  # Gemma 3: one attention kind per layer
        cut.layer_types = list(cut.layer_types[:depth])
    report = logging.getLogger("transformers.modeling_utils")
    quiet = _LeftOutLayersReport()
    report.addFilter(quiet)
    try:
        model = load_model(source, dtype=dtype, device_map=device_map, config=cut, **kwargs)
    finally:
        report.removeFilter(quiet)
    setattr(model, FULL_CONFIG_ATTR, full)
    logger.info("qgpm: loaded %d of %d decoder layers for pass 1 (generation runs elsewhere); about %.1f MiB of weights not loaded",
                depth, full.num_hidden_layers, weight_bytes_not_loaded(model) / 2**20)
    return model, head_set


class _LeftOutLayersReport(logging.Filter):
    """Drops transformers' load report when all it reports is the decoder layers left out on
    purpose (their weights are in the checkpoint, not in the model); any other row keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "LOAD REPORT" not in msg:
            return True
        rows = [line for line in msg.splitlines() if "|" in line and any(k in line for k in ("UNEXPECTED", "MISSING", "MISMATCH"))]
        return not (rows and all("UNEXPECTED" in line and "layers." in line for line in rows))


def weight_bytes_not_loaded(model: torch.nn.Module) -> int:
    """Bytes of decoder-layer weights a pass-1 model did not load: the loaded layers' mean size
    (at the loaded dtype) times the layers left out (0 for a whole model)."""
    missing = full_layers(model) - loaded_layers(model)
    if missing <= 0 or not is_partial(model):
        return 0
    layers = decoder_layers(model)
    size = sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters())
    return round(size / len(layers) * missing)


def full_rotary(model: torch.nn.Module, info: Any) -> Any:
    """``info`` (:func:`qgpm.rope.rotary_info` of ``model``) with the layer kinds of every layer
    of the checkpoint, so that plans are built for the model the server runs."""
    full = getattr(model, FULL_CONFIG_ATTR, None)
    if full is None or info is None or info.layer_kinds is None:
        return info
    return dataclasses.replace(info, layer_kinds=tuple(full.layer_types))


class NoLocalGenerator:
    """The in-process generator of a pass-1 model: every use raises :class:`LayersNotLoadedError`."""

    name = "transformers (pass-1 layers only)"

    def __init__(self, loaded: int, full: int) -> None:
        self.loaded, self.full = loaded, full

    def refuse(self, what: str) -> LayersNotLoadedError:
        return LayersNotLoadedError(
            f"{what} needs decoder layers this engine did not load: it holds {self.loaded} of {self.full} "
            "(pass1_layers_only, the default with a remote generator). Generate on the remote generator, or load the engine "
            "with pass1_layers_only=False")

    def require(self, what: str) -> None:
        """Raise: ``what`` needs every layer."""
        raise self.refuse(what)

    def check(self, spec: Any, config: Any) -> None:
        raise self.refuse("generation")

    def generate(self, call: Any, decoding: Any, *, score: Any = None) -> Any:
        raise self.refuse("generation")

    def stream(self, call: Any, decoding: Any) -> Any:
        raise self.refuse("generation")

    def logprob(self, call: Any, score: Any) -> float:
        raise self.refuse("scoring a continuation")
