"""LLMLingua-2 as an input-editing baseline: compress each document, answer with standard RoPE.

The compressor comes from the ``llmlingua`` package (``pip install llmlingua``; its
dependencies are already qgpm's) with weights the user supplies
(:class:`~qgpm.baselines.options.LLMLingua2Options`). Nothing is downloaded at run time:
llmlingua's constructor loads GPT-3.5's tiktoken encoding only to report token counts, so
that one call is answered with a counter over the compressor's own tokenizer (the
rate-based compression used here does not read those counts).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from .options import LLMLingua2Options

__all__ = ["CompressedContext", "load_compressor", "compress_context", "clear_compressor_cache"]

_CACHE: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


@dataclass
class CompressedContext:
    """Result of an LLMLingua-2 edit (``result.edit`` of a ``llmlingua-2`` call).

    ``text``: the compressed documents joined by a blank line; ``documents``: each
    compressed document; ``original_tokens`` / ``compressed_tokens``: counted with the
    compressor's tokenizer; ``mode``: ``"llmlingua-2"``.
    """

    text: str
    documents: list[str]
    original_tokens: int
    compressed_tokens: int
    mode: str = "llmlingua-2"
    chunks: list = field(default_factory=list)  # no chunk structure (adapters read these names)
    kept: list = field(default_factory=list)


class _TokenCounter:
    """Stands in for llmlingua's ``oai_tokenizer`` (only ``encode`` is used, for counts)."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list:
        if self.tokenizer is None:
            return text.split()
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def load_compressor(options: LLMLingua2Options) -> Any:
    """The ``llmlingua.PromptCompressor`` for ``options.model`` on ``options.device`` (cached per process)."""
    try:
        import llmlingua  # optional: qgpm[llmlingua]
        import llmlingua.prompt_compressor as pc_mod  # optional: qgpm[llmlingua]
    except ImportError as exc:
        raise ImportError(
            "method='llmlingua-2' needs the package llmlingua: `pip install llmlingua==0.2.2` (its dependencies are "
            "already qgpm's: torch, transformers, accelerate, tiktoken, nltk, numpy)"
        ) from exc
    key = (options.model, options.device)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        tik = pc_mod.tiktoken
        real = tik.encoding_for_model
        tik.encoding_for_model = lambda *a, **k: _TokenCounter()  # no download of GPT-3.5's encoding
        try:
            comp = llmlingua.PromptCompressor(model_name=options.model, use_llmlingua2=True, device_map=options.device,
                                              model_config={"trust_remote_code": False})
        finally:
            tik.encoding_for_model = real
        comp.oai_tokenizer = _TokenCounter(comp.tokenizer)
        _CACHE[key] = comp
        return comp


def clear_compressor_cache() -> None:
    """Forget the loaded compressors."""
    with _LOCK:
        _CACHE.clear()


def compress_context(context: str | Sequence[str], options: LLMLingua2Options) -> CompressedContext:
    """LLMLingua-2 over each document of ``context`` (a string is one document)."""
    docs = [context] if isinstance(context, str) else [str(d) for d in context]
    if not any(d.strip() for d in docs):
        raise ValueError("context is empty: pass the text to answer from")
    comp = load_compressor(options)
    out, n_in, n_out = [], 0, 0
    with _LOCK:  # one compressor object, not known to be thread-safe
        for doc in docs:  # one call per document, so documents keep their boundaries
            if not doc.strip():
                continue
            res = comp.compress_prompt([doc], rate=options.rate, force_tokens=list(options.force_tokens))
            out.append(str(res["compressed_prompt"]).strip())
            n_in += int(res.get("origin_tokens", 0))
            n_out += int(res.get("compressed_tokens", 0))
    return CompressedContext("\n\n".join(out), out, n_in, n_out)
