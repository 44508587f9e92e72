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


_CANCELLED: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("qgpm_cancelled", default=None)
_POLL_S = 0.05


@contextlib.contextmanager
def cancelled_by(check: Callable[[], bool]) -> Iterator[None]:
    """Within the block, a wait for the model's lock (:func:`model_turn`) gives up with
    :class:`CallCancelled` as soon as ``check()`` is true: a closed stream's call does not wait
    for the calls ahead of it, nor then run its own pass 1 or prefill."""
    token = _CANCELLED.set(check)
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
    check = _CANCELLED.get()
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


