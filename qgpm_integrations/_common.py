"""What both adapters share: model settings with HuggingFace's names, checked before loading.

Framework-free (imports neither LangChain nor LlamaIndex).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

__all__ = ["check_generate_kwargs", "check_heads", "device_map_for", "is_loaded_model", "check_model_args"]

# model.generate arguments the adapters set themselves, and engine.answer arguments that
# would be taken for something else if they came in generate_kwargs.
_GENERATE_OWN = {
    "input_ids", "attention_mask", "streamer", "stopping_criteria", "tokenizer", "pad_token_id", "stop_strings", "do_sample",
}
_ENGINE_ARGS = {
    "context", "question", "method", "evidence", "system", "instruction", "answer_prefix", "template", "reranker", "k",
    "config", "score", "messages", "call",
}


def check_generate_kwargs(generate_kwargs: Mapping[str, Any] | None, owner: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """Check ``generate_kwargs`` (extra ``model.generate`` arguments) and return a copy.

    ``fields`` maps generate argument names the adapter has a field for (``temperature``,
    ``max_new_tokens``, ...) to that field's name: those raise, pointing to the field, so
    one setting never has two values.
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
    return out


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
