"""Running a model under a plan for one call (pass 2 and decoding), and what QGPM supports.

:func:`apply_plan` takes the model's lock and enters the plan's own ``installed`` context: a
QGPM position plan installs its layer hooks (:mod:`qgpm.hooks`), a RoPE baseline its attention
function (:mod:`qgpm.baselines`). This module knows neither: it reads the
:class:`InstallablePlan` protocol both implement. Whatever is installed lives only inside the
``with`` block and is removed in ``finally``: after any call, including one that raised, the
model is exactly the unpatched model. A per-model re-entrant lock serializes calls, so two
threads never mix their plans.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
import weakref
from typing import Callable, ContextManager, Iterator, Protocol

import torch

from .layers import UnsupportedModelError, decoder_layers
from .rope import RotaryInfo, rotary_info


class InstallablePlan(Protocol):
    """A plan that installs itself on a model for the length of a block: QGPM's position plans
    (:class:`qgpm.rope.PositionPlan`) and the RoPE baselines' attention plans
    (:class:`qgpm.baselines.BaselinePlan`); :func:`apply_plan` enters it under the model lock."""

    def installed(self, model: torch.nn.Module) -> ContextManager[None]: ...

__all__ = [
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "RotaryInfo",
    "rotary_info",
    "check_supported",
    "check_answering_model",
    "decoder_layers",
    "model_lock",
    "model_turn",
    "cancelled_by",
    "CallCancelled",
    "apply_plan",
    "InstallablePlan",
]

SUPPORTED_FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "granite", "gemma3_text")
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_LENGTH_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")  # transformers recomputes their inv_freq for the sequence length

_LOCKS: "weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def cache_kwarg(fn) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older), whichever ``fn`` takes."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def model_lock(model: torch.nn.Module) -> threading.RLock:
    """The re-entrant lock that serializes QGPM calls on ``model``."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = threading.RLock()
            _LOCKS[model] = lock
        return lock


class CallCancelled(Exception):
    """A call was stopped (its stream closed) while it waited for its turn on the model."""


_CANCELLED: contextvars.ContextVar[tuple[Callable[[], bool], Callable[[], None] | None] | None] = contextvars.ContextVar(
    "qgpm_cancelled", default=None)
_POLL_S = 0.05


@contextlib.contextmanager
def cancelled_by(check: Callable[[], bool], *, on_failure: Callable[[], None] | None = None) -> Iterator[None]:
    """Within the block, a wait for the model's lock (:func:`model_turn`) gives up with
    :class:`CallCancelled` as soon as ``check()`` is true: a closed stream's call does not wait
    for the calls ahead of it, nor then run its own pass 1 or prefill. ``on_failure()`` runs when
    work under the lock raises, before the lock is let go: the calls waiting behind it (whose
    ``check`` it sets) then give up rather than take their turn."""
    token = _CANCELLED.set((check, on_failure))
    try:
        yield
    finally:
        _CANCELLED.reset(token)


@contextlib.contextmanager
def model_turn(model: torch.nn.Module) -> Iterator[None]:
    """Hold ``model``'s lock (:func:`model_lock`) for the block. Under :func:`cancelled_by` the
    wait is checked every few hundredths of a second, and a cancelled call raises
    :class:`CallCancelled` instead of taking its turn (a thread that holds the lock already
    re-enters at once)."""
    lock = model_lock(model)
    check, on_failure = _CANCELLED.get() or (None, None)
    if check is None:
        lock.acquire()
    else:
        while not lock.acquire(timeout=_POLL_S):
            if check():
                raise CallCancelled("the call was stopped while it waited for the model")
        if check():
            lock.release()
            raise CallCancelled("the call was stopped while it waited for the model")
    try:
        yield
    except BaseException:
        if on_failure is not None:
            on_failure()  # before the lock is let go (see cancelled_by)
        raise
    finally:
        lock.release()


def check_supported(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` naming the family unless QGPM supports it."""
    family = getattr(model.config, "model_type", type(model).__name__)
    if family not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"model family '{family}' ({type(model).__name__}) is not supported by QGPM. Supported: "
            f"{', '.join(SUPPORTED_FAMILIES)} (Llama-style decoders with full rotate-half RoPE passed to "
            "each layer as position_embeddings; gemma3_text is Gemma3ForCausalLM). Families with partial "
            "rotary, ALiBi or no RoPE need an adapter; method='vanilla' is not affected."
        )
    info = rotary_info(model)
    for kind, one in ([(None, info)] if not info.layered else sorted(info.kinds.items())):
        if one.rope_type not in _SUPPORTED_ROPE_TYPES:
            where = "" if kind is None else f" ({kind} layers)"
            why = "its frequencies change with the sequence length" if one.rope_type in _LENGTH_DEPENDENT_ROPE_TYPES else "qgpm does not implement it"
            raise UnsupportedModelError(
                f"RoPE type '{one.rope_type}'{where} of this {family} model is not supported ({why}); supported RoPE types: "
                f"{', '.join(_SUPPORTED_ROPE_TYPES)}; method='vanilla' and the input-editing methods still run"
            )


def check_answering_model(model: torch.nn.Module, tokenizer: object) -> None:
    """Refuse, before any work, a model or tokenizer no method can answer with (vanilla included):
    a slow tokenizer (roles and sentences map to tokens by character offsets), an encoder or
    encoder-decoder checkpoint (a BERT-like encoder loads as a causal LM with a new, random LM head
    and answers noise), or a tokenizer whose vocabulary overruns the model's embedding table
    (another model's tokenizer: an ``IndexError`` deep in torch otherwise)."""
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("QGPM needs a fast (Rust) tokenizer: character offsets map roles and sentences to tokens")
    cfg, name = model.config, type(model).__name__
    family = getattr(cfg, "model_type", name)
    if getattr(cfg, "is_encoder_decoder", False) or (family in _encoder_families() and not getattr(cfg, "is_decoder", False)):
        raise UnsupportedModelError(
            f"{name} ('{family}') is an encoder{'-decoder' if getattr(cfg, 'is_encoder_decoder', False) else ''}, not a "
            "decoder-only causal LM: it cannot answer (every method, vanilla included, needs a causal LM such as Llama, "
            "Qwen2, Mistral or Gemma 3); load one with AutoModelForCausalLM")
    try:
        rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    except (AttributeError, NotImplementedError):  # a model class without the accessor: nothing to compare
        rows = None
    vocab = getattr(tokenizer, "vocab_size", None)
    if isinstance(rows, int) and isinstance(vocab, int) and vocab > rows:
        raise ValueError(f"the tokenizer's vocabulary ({vocab} tokens) is larger than the model's embedding table ({rows} rows): "
                         "it is not this model's tokenizer; load the tokenizer saved with the model (AutoTokenizer.from_pretrained "
                         "on the model's own folder or id)")


def _encoder_families() -> frozenset[str]:
    """Families transformers knows both as masked-LM encoders and as causal LMs (BERT, RoBERTa,
    ...): their causal-LM class is a decoder only with ``config.is_decoder=True``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES  # heavy: transformers' auto classes, read only when an engine is built

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) & frozenset(MODEL_FOR_MASKED_LM_MAPPING_NAMES)


@contextlib.contextmanager
def apply_plan(model: torch.nn.Module, plan: InstallablePlan | None) -> Iterator[None]:
    """Within the block, every forward of ``model`` runs under ``plan``, installed through its
    own ``installed`` context (a position plan's layer hooks, a RoPE baseline's attention
    function) under the model lock. ``plan=None`` only takes the lock (vanilla behaviour).
    Whatever happens inside, the model is unpatched on exit."""
    with model_turn(model):
        if plan is None:
            yield
            return
        with plan.installed(model):
            yield


