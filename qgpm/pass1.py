"""The relevance stage of a ``qgpm`` call: sentence relevance ``z`` from the heads, a reranker, or both.

text -> role spans -> tokens -> **relevance** -> scores -> positions. :func:`sentence_heads_logits`
is the one way pass 1 is run over a prompt (the engine and calibration both use it);
:func:`qgpm_relevance` adds the relevance source (:mod:`qgpm.sources`), the pass-1 precision
and the prefill continuation (:mod:`qgpm.prefill`), and hands ``z`` to the plan stage through
a callback, because whether pass 1 goes on as a prefill depends on the plan.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .config import QGPMConfig
from .layers import input_device
from .loading import cuda_bf16_native, parse_dtype
from .plan import PlanOutcome
from .prefill import Prefill, prefill_reuse_pays, fresh_cache
from .prompt import Prompt
from .relevance import Pass1Stats, head_token_logits, sentence_logits
from .rerank import get_reranker
from .shaping import fuse_heads
from .sources import fuse_sources, parse_source, reranker_relevance

logger = logging.getLogger("qgpm")

__all__ = ["Pass1Outcome", "sentence_heads_logits", "qgpm_relevance", "pass1_precision", "fast_on", "dtype_name"]


def sentence_heads_logits(model: torch.nn.Module, prompt: Prompt, heads: Sequence[tuple[int, int]], *, exclude_newline_tokens: bool,
                          **pass1: Any) -> torch.Tensor:
    """Pass 1 over ``prompt`` (Eq. 4 for each of ``heads``), max-pooled per context sentence:
    ``[len(heads), sentences]``. ``pass1``: :func:`~qgpm.relevance.head_token_logits`'s options
    (``stats``, ``precision``)."""
    tl = head_token_logits(model, prompt.input_ids, list(heads), prompt.query_rows, **pass1)
    return sentence_logits(tl, prompt.token_sentence, len(prompt.sentences), prompt.newline_tokens if exclude_newline_tokens else None)


@dataclass
class Pass1Outcome:
    """What the relevance stage found: ``z`` and the plan built from it, the stage clocks, the
    vanilla prefill pass 1 left behind (when it went on as one) and what ran."""

    z: torch.Tensor
    planned: PlanOutcome
    pass1_s: float
    plan_s: float
    source: str
    heads: int = 0
    layers_run: int = 0
    prefill: Prefill | None = None
    details: dict[str, Any] = field(default_factory=dict)


def qgpm_relevance(model: torch.nn.Module, prompt: Prompt, question: str, cfg: QGPMConfig, heads: Sequence[tuple[int, int]],
                   plan_from: Callable[[torch.Tensor], PlanOutcome], *, n_layers: int, precision: torch.dtype | None,
                   reuse_prefill: bool) -> Pass1Outcome:
    """``z`` per context sentence from ``cfg.relevance`` and the plan ``plan_from(z)`` builds.

    A reranker source scores the sentences against the question with no pass 1; the heads
    run pass 1 over ``heads`` (at ``precision`` when it is not ``None``). With
    ``reuse_prefill`` (and the model's own precision) pass 1 goes on through every layer as
    the vanilla prefill when :func:`prefill_reuse_pays` says that is cheaper than pass 2 alone.
    """
    t = time.perf_counter()
    source = parse_source(cfg.relevance)
    z_rerank = (reranker_relevance(get_reranker(source.reranker), prompt.question_text or question, [s.text for s in prompt.sentences])
                if source.reranker is not None else None)
    clock: dict[str, Any] = {}

    def plan(sl: torch.Tensor | None) -> PlanOutcome:  # relevance -> scores -> positions
        clock["pass1_end"] = time.perf_counter()
        if sl is None:
            clock["z"] = z_rerank
        else:
            clock["z"] = fuse_heads(sl) if z_rerank is None else fuse_sources(fuse_heads(sl), z_rerank)
        clock["planned"] = plan_from(clock["z"])
        clock["plan_end"] = time.perf_counter()
        return clock["planned"]

    def outcome(**kw: Any) -> Pass1Outcome:
        return Pass1Outcome(clock["z"], clock["planned"], clock["pass1_end"] - t, clock["plan_end"] - clock["pass1_end"], source.spec, **kw)

    if not source.heads:
        plan(None)
        return outcome()
    ex = prompt.newline_tokens if cfg.exclude_newline_tokens else None
    stats = Pass1Stats()
    cache = fresh_cache(model) if precision is None and reuse_prefill else None
    if cache is not None:
        deepest = max(layer for layer, _ in heads)

        def go_on(tl: torch.Tensor) -> bool:
            planned = plan(sentence_logits(tl, prompt.token_sentence, len(prompt.sentences), ex))
            return prefill_reuse_pays(planned.plan.vanilla_prefix(), prompt.num_tokens, deepest, n_layers)

        head_token_logits(model, prompt.input_ids, list(heads), prompt.query_rows, stats=stats, cache=cache, go_on=go_on)
    else:
        plan(sentence_heads_logits(model, prompt, heads, exclude_newline_tokens=cfg.exclude_newline_tokens, stats=stats, precision=precision))
    end = time.perf_counter()
    prefill = Prefill(cache, prompt.num_tokens, end - clock["plan_end"]) if stats.continued else None
    details = {"pass1_dtype": dtype_name(precision)} if precision is not None else {}
    return outcome(heads=len(heads), layers_run=len(stats.layers_run), prefill=prefill, details=details)


def pass1_precision(model: torch.nn.Module, cfg: QGPMConfig, context_tokens: int | None, warned: set[torch.dtype]) -> torch.dtype | None:
    """The dtype pass 1 runs at under ``cfg`` when it is not the model's own, else ``None``
    (see :attr:`QGPMConfig.pass1_dtype <qgpm.config.QGPMConfig.pass1_dtype>`): ``"auto"`` is
    bfloat16 for a float32 model on hardware that multiplies bfloat16 natively, except for a
    call whose context of ``context_tokens`` is no longer than ``keep_length`` (it keeps
    vanilla positions, so the exact pass 1 going on as its prefill costs one prefill in all);
    else the model's dtype. An explicit dtype without such hardware is used, with a warning
    (once per dtype: ``warned`` holds those already logged)."""
    want = cfg.pass1_dtype
    if want is None:
        return None
    model_dtype, device = next(model.parameters()).dtype, input_device(model)
    if want == "auto":
        if context_tokens is not None and 0 < context_tokens <= cfg.keep_length:
            return None
        return torch.bfloat16 if model_dtype == torch.float32 and fast_on(device, torch.bfloat16) else None
    dtype = parse_dtype(want)  # a name QGPMConfig has checked
    if dtype == model_dtype:
        return None
    if dtype not in warned and not fast_on(device, dtype):
        warned.add(dtype)
        logger.warning("qgpm: pass1_dtype=%r on %s: this hardware has no fast %s matrix multiply, so pass 1 is likely slower "
                       "than at the model's %s, not faster. Set pass1_dtype=None (or 'auto') in QGPMConfig to run it at the "
                       "model's dtype.", want, device, want, dtype_name(model_dtype))
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fast_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``device`` multiplies ``dtype`` matrices natively (oneDNN's check on a CPU,
    :func:`~qgpm.loading.cuda_bf16_native` for bfloat16 on a GPU: Ampere or newer; other devices
    are assumed to)."""
    if dtype == torch.float32:
        return True
    if device.type == "cuda":
        return dtype != torch.bfloat16 or cuda_bf16_native(device)
    if device.type != "cpu":
        return True
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
    fn = getattr(torch.ops.mkldnn, check, None) if check else None
    try:
        return bool(fn()) if fn is not None else False
    except RuntimeError:
        return False
