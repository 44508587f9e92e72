"""What both adapters share: model settings with HuggingFace's names, checked before loading.

Framework-free (imports neither LangChain nor LlamaIndex).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from qgpm.batching import Cancellable, iterate_in_thread  # the sync-to-async stream bridge, re-exported for the adapters

__all__ = ["check_generate_kwargs", "check_heads", "check_relevance", "check_reranker", "device_map_for", "is_loaded_model", "check_model_args", "shared_engine",
           "clear_engine_cache", "heads_key", "kwargs_key", "model_key", "iterate_in_thread", "Cancellable"]


# model.generate arguments the adapters set themselves, and engine.answer arguments that
# would be taken for something else if they came in generate_kwargs.
_GENERATE_OWN = {
    "input_ids", "attention_mask", "streamer", "stopping_criteria", "tokenizer", "pad_token_id", "stop_strings", "do_sample",
}
_ENGINE_ARGS = {
    "context", "question", "method", "evidence", "system", "instruction", "answer_prefix", "template", "reranker", "k",
    "config", "score", "messages", "call",
}


def check_generate_kwargs(generate_kwargs: Mapping[str, Any] | None, owner: str, fields: Mapping[str, str], *,
                          remote: bool = False) -> dict[str, Any]:
    """Check ``generate_kwargs`` (extra ``model.generate`` arguments) and return a copy.

    ``fields`` maps generate argument names the adapter has a field for (``temperature``,
    ``max_new_tokens``, ...) to that field's name: those raise, pointing to the field, so
    one setting never has two values. The rest are checked as the generator will check them
    on every call (``remote``: a vLLM server's, else transformers' ``generate()``), and the
    values that can be checked without a model (:func:`qgpm.decoding.check_extra_values`).
    """
    if generate_kwargs is None:
        return {}
    if not isinstance(generate_kwargs, Mapping):
        raise TypeError(f"{owner}: generate_kwargs must be a dict of model.generate arguments, got {type(generate_kwargs).__name__}")
    out = dict(generate_kwargs)
    for key in out:
        if not isinstance(key, str):
            raise TypeError(f"{owner}: generate_kwargs keys must be strings, got {key!r}")
        if key in fields:
            raise ValueError(f"{owner}: set {fields[key]}=... instead of generate_kwargs[{key!r}]")
        if key == "do_sample":
            raise ValueError(f"{owner}: sampling is on when temperature > 0 (greedy at 0); drop generate_kwargs['do_sample']")
        if key in _GENERATE_OWN or key in _ENGINE_ARGS:
            raise ValueError(f"{owner}: generate_kwargs[{key!r}] is set by qgpm itself and cannot be overridden")
    from qgpm.decoding import check_extra_values
    from qgpm.generation import check_generate_extras  # transformers' GenerationConfig: loaded once a model is configured
    from qgpm.serving import check_remote_extras

    try:
        (check_remote_extras if remote else check_generate_extras)(out)
        check_extra_values(out)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{owner}: generate_kwargs: {exc}") from None
    return out


def check_relevance(relevance: str | None, method: str) -> None:
    """Refuse a ``relevance=`` the call would not use: a spec :func:`qgpm.sources.parse_source`
    rejects (a malformed one, or a reranker of no known kind: checked by name, nothing loads),
    or any source for a method that does not rank sentences (only ``qgpm`` does)."""
    from qgpm.methods import Stage, method_spec  # lazy: the adapters' shared helpers load no engine code up front
    from qgpm.sources import parse_source  # lazy: as above

    if relevance is None:
        return
    parse_source(relevance)
    if method_spec(method).stage is not Stage.HEADS:
        raise ValueError(f"relevance={relevance!r} sets how method='qgpm' ranks sentences; method={method!r} takes none")


def check_reranker(reranker: Any, owner: str) -> None:
    """Refuse a ``reranker=`` that :func:`qgpm.rerank.get_reranker` would refuse: an unknown
    spec, or an object without the reranker protocol (checked by name; nothing loads)."""
    from qgpm.rerank import check_reranker_spec  # lazy: as in check_relevance

    try:
        check_reranker_spec(reranker)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{owner}: reranker={reranker!r}: {exc}") from None


def check_heads(heads: Any, owner: str) -> None:
    """Fail before loading on a head-set argument that cannot work."""
    if heads is None or (isinstance(heads, str) and heads == "calibrate"):
        return
    if isinstance(heads, (str, os.PathLike)):
        if not os.path.isfile(heads):
            raise FileNotFoundError(
                f"{owner}: heads={str(heads)!r} is not a head-set file. Pass None (the stored set), 'calibrate', "
                "a head-set JSON path or [(layer, head), ...]"
            )
        return
    from qgpm import HeadSet

    if isinstance(heads, HeadSet):
        return
    try:
        pairs = [(int(l), int(h)) for l, h in heads]
    except (TypeError, ValueError):
        raise TypeError(f"{owner}: heads must be None, 'calibrate', a head-set path, a HeadSet or [(layer, head), ...]; got {heads!r}") from None
    if not pairs:
        raise ValueError(f"{owner}: heads is an empty list")


def is_loaded_model(obj: Any) -> bool:
    """Whether ``obj`` is an already-loaded model (a ``torch.nn.Module``)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, torch.nn.Module)


def check_model_args(owner: str, model: Any, tokenizer: Any, model_kwargs: Any) -> dict[str, Any]:
    """Check model / tokenizer / model_kwargs together; return the normalized model_kwargs."""
    from qgpm.loading import model_load_kwargs

    if is_loaded_model(model):
        if tokenizer is None:
            raise ValueError(f"{owner}: an already-loaded model needs its tokenizer too: pass tokenizer=AutoTokenizer.from_pretrained(...)")
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(f"{owner}: QGPM needs a fast (Rust) tokenizer (character offsets); got {type(tokenizer).__name__}")
        if model_kwargs:
            raise ValueError(f"{owner}: model_kwargs are loading arguments; the model is already loaded (drop model_kwargs)")
        return {}
    if tokenizer is not None:
        raise ValueError(f"{owner}: tokenizer= goes with an already-loaded model=; with a model id or path the tokenizer is loaded from it")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"{owner}: model must be an HF id, a folder, a .gguf path or a loaded transformers model; got {type(model).__name__}")
    return model_load_kwargs(model_kwargs)


def device_map_for(device: Any) -> Any:
    """``device_map`` for a ``device`` given as in ``HuggingFacePipeline.from_model_id``.

    An int is a CUDA index (``-1`` = CPU); a string is ``cpu``, ``cuda``, ``cuda:N`` or
    ``auto`` (the first GPU when there is one, else the CPU).
    """
    from qgpm.loading import resolve_device

    if isinstance(device, bool):
        raise TypeError("device must be an int (CUDA index, -1 = CPU) or a string such as 'cuda'")
    if isinstance(device, int):
        return "cpu" if device < 0 else resolve_device(f"cuda:{device}")
    if isinstance(device, str):
        return resolve_device(device)
    raise TypeError(f"device must be an int (CUDA index, -1 = CPU) or a string such as 'cuda', got {type(device).__name__}")


# --------------------------------------------------------------------------- one engine per model, for both adapters

_ENGINES: dict[tuple, Any] = {}
_ENGINES_LOCK = threading.Lock()


def heads_key(heads: Any) -> Any:
    """A hashable stand-in for a ``heads=`` argument."""
    if heads is None or isinstance(heads, (str, os.PathLike)):
        return None if heads is None else str(heads)
    try:
        return tuple(tuple(int(x) for x in h) for h in heads)
    except TypeError:
        return ("object", id(heads))


def model_key(model: Any) -> str:
    """The cache key of a model argument (the embedded default under one name)."""
    from qgpm.defaults import DEFAULT_MODEL, is_default_model

    return DEFAULT_MODEL if is_default_model(model) else str(model)


def kwargs_key(model_kwargs: Mapping[str, Any] | None) -> tuple:
    """A hashable stand-in for ``model_kwargs``."""
    return tuple(sorted((k, repr(v)) for k, v in (model_kwargs or {}).items()))


def shared_engine(model: Any, heads: Any, model_kwargs: Mapping[str, Any] | None = None, vllm_url: str | None = None,
                  vllm_model: str | None = None) -> Any:
    """One ``QGPM`` engine per (model, heads, model_kwargs, vLLM server) per process, shared by
    every chat model and LLM that names the same ones (the weights are cached by qgpm itself)."""
    from qgpm import QGPM
    from qgpm.defaults import DEFAULT_MODEL

    key = (model_key(model), heads_key(heads), kwargs_key(model_kwargs), vllm_url, vllm_model)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            generator = None
            if vllm_url is not None:
                from qgpm.serving import VLLMServer

                generator = VLLMServer(vllm_url, model=vllm_model)
            engine = QGPM.from_pretrained(None if key[0] == DEFAULT_MODEL else key[0], heads=heads, generator=generator,
                                          reuse_prefill=generator is None, **dict(model_kwargs or {}))  # nothing to reuse on a server
            _ENGINES[key] = engine
        return engine


def clear_engine_cache() -> None:
    """Forget the engines built by the adapters (the model weights stay cached by qgpm)."""
    with _ENGINES_LOCK:
        _ENGINES.clear()
