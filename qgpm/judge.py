"""The LLM-judge reranker: P("yes") of a causal LM asked whether a passage is relevant.

The paper's reranker is ``Qwen/Qwen3-Reranker-4B`` under its own judge prompt; by default
:class:`LLMJudgeReranker` runs on the embedded SmolLM2-135M-Instruct (weak as a judge, but
offline and cheap). :func:`qgpm.rerank.get_reranker` builds it from ``"judge"`` or
``"judge:<path-or-id>"``.
"""

from __future__ import annotations

import inspect
import os
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from .loading import load_model, load_tokenizer, resolve_source
from .rerank_contract import check_inputs, finite_scores
from .tokens import encode_prompt, plain_backend

__all__ = ["LLMJudgeReranker", "QWEN3_RERANKER_SYSTEM", "DEFAULT_INSTRUCTION"]

QWEN3_RERANKER_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".'
)
"""System prompt of the Qwen3-Reranker judge format."""

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
"""Default ``<Instruct>`` of Qwen3-Reranker (its model card's default)."""

# Exact Qwen3-Reranker raw prompt layout (model card / Qwen3-Embedding repo):
#   prefix + "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" + suffix
_QWEN3_PREFIX = f"<|im_start|>system\n{QWEN3_RERANKER_SYSTEM}<|im_end|>\n<|im_start|>user\n"
_QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
_DOC_SLOT = "QGPMDOCUMENTSLOT"


class LLMJudgeReranker:
    """Score = P("yes") of a causal LM judging relevance (Qwen3-Reranker format).

    The prompt has a system turn (:data:`QWEN3_RERANKER_SYSTEM`), a user turn
    ``"<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}"`` and an
    open assistant turn. The score of a passage is the softmax over the two logits
    ``[no, yes]`` at the last prompt position, taking the ``yes`` entry.

    Two prompt modes:

    * **Qwen3-Reranker** (auto-detected when the model name contains
      ``"Qwen3-Reranker"``, or forced with ``qwen3_format=True``): the exact raw
      prompt of the model card, ending with an empty ``<think>`` block, and the
      single tokens ``"yes"`` / ``"no"``.
    * **Any other chat model** (the default SmolLM2 included): the same system and
      user messages rendered by the model's own chat template with the generation
      prompt (``enable_thinking=False`` is passed so Qwen3-style templates add the
      empty think block). The ``yes`` / ``no`` logits are each the log-sum-exp over
      the single-token case variants (``"yes"``, ``"Yes"`` and ``"no"``, ``"No"``):
      general chat models start answers capitalized, and on SmolLM2 the lowercase
      pair alone does not even order an obvious case correctly. A model without a
      chat template gets a plain-text rendering of the two turns.

    Long passages are truncated (from their end) so that the whole prompt fits in
    ``max_length`` tokens; the instruction and query are never truncated. Passages
    are batched by length with left padding; position ids follow the attention mask,
    so a passage's score does not depend on the batch it lands in.

    Args:
        model: ``None`` / ``"smollm2"`` for the embedded SmolLM2-135M-Instruct, any HF
            id or local path (e.g. ``"Qwen/Qwen3-Reranker-4B"``), or an already loaded
            causal LM (then ``tokenizer`` is required).
        tokenizer: Tokenizer to use with a loaded ``model``; loaded from the source
            otherwise.
        instruction: Task instruction placed in ``<Instruct>``.
        batch_size: Passages per forward pass.
        max_length: Maximum prompt length in tokens (prompt + passage).
        dtype: Passed to ``from_pretrained`` when the model is loaded here.
        device_map: Passed to ``from_pretrained`` when the model is loaded here.
        qwen3_format: Force (``True``) or forbid (``False``) the raw Qwen3-Reranker
            prompt; ``None`` auto-detects from the model name.

    The model is loaded lazily on the first :meth:`score` call (or :meth:`load`), and
    shared with the rest of qgpm through :mod:`qgpm.loading`'s per-process cache.
    """

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        instruction: str = DEFAULT_INSTRUCTION,
        batch_size: int = 8,
        max_length: int = 2048,
        dtype: Any = None,
        device_map: Any = None,
        qwen3_format: bool | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length < 16:
            raise ValueError(f"max_length must be >= 16, got {max_length}")
        if not instruction.strip():
            raise ValueError("instruction must not be empty")
        self.instruction = instruction
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self._dtype = dtype
        self._device_map = device_map
        self._qwen3_format_arg = qwen3_format
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = tokenizer
        self._source: Any = None
        if model is None or isinstance(model, (str, os.PathLike)):
            self._source = resolve_source(model)
            model_name = self._source.name or str(self._source.path)
        else:
            if tokenizer is None:
                raise ValueError("LLMJudgeReranker: pass the tokenizer along with a loaded model")
            self._model = model
            model_name = str(getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__)
        self.model_name = model_name
        self.qwen3_format = (
            bool(qwen3_format) if qwen3_format is not None else "qwen3-reranker" in model_name.lower()
        )
        self.name = f"judge:{Path(model_name.rstrip('/')).name or model_name}"

    # -- loading -------------------------------------------------------------------

    def load(self) -> "LLMJudgeReranker":
        """Load the model and tokenizer now (otherwise done on the first ``score``)."""
        with self._lock:
            if self._model is None:
                self._model = load_model(self._source, dtype=self._dtype, device_map=self._device_map)
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self._source)
            if not hasattr(self, "_yes_ids"):
                self._yes_ids, self._no_ids = self._answer_token_ids()
        return self

    @property
    def model(self) -> Any:
        """The causal LM (loads it if needed)."""
        return self.load()._model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (loads it if needed)."""
        return self.load()._tokenizer

    def _answer_token_ids(self) -> tuple[list[int], list[int]]:
        """Token ids whose logits make up the ``yes`` and ``no`` scores."""
        tok = self._tokenizer
        words = (["yes"], ["no"]) if self.qwen3_format else (["yes", "Yes"], ["no", "No"])
        out: list[list[int]] = []
        for group in words:
            ids: list[int] = []
            for w in group:
                enc = tok.encode(w, add_special_tokens=False)
                if len(enc) == 1 and enc[0] not in ids:
                    ids.append(enc[0])
            if not ids:
                raise ValueError(
                    f"{self.model_name}: none of {group} is a single token of this tokenizer; "
                    "the yes/no judge needs single-token answers"
                )
            out.append(ids)
        return out[0], out[1]

    # -- prompt --------------------------------------------------------------------

    def prompt_parts(self, query: str) -> tuple[str, str]:
        """Text before and after the passage for ``query``.

        The prompt for passage ``doc`` is ``before + " " + doc + after``; ``before``
        ends with ``"<Document>:"`` so the space joins the passage's first word, as in
        a joint tokenization of the full prompt.
        """
        user = f"<Instruct>: {self.instruction}\n<Query>: {query}\n<Document>: {_DOC_SLOT}"
        if self.qwen3_format:
            full = _QWEN3_PREFIX + user + _QWEN3_SUFFIX
        else:
            tok = self.tokenizer
            messages = [{"role": "system", "content": QWEN3_RERANKER_SYSTEM}, {"role": "user", "content": user}]
            if getattr(tok, "chat_template", None):
                full = tok.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
                )
            else:
                full = f"{QWEN3_RERANKER_SYSTEM}\n\n{user}\n\nAnswer (yes or no):"
        marker = f"<Document>: {_DOC_SLOT}"
        if full.count(marker) != 1:
            raise ValueError(f"{self.model_name}: could not locate the document slot in the rendered judge prompt")
        before, after = full.split(marker)
        return before + "<Document>:", after

    # -- scoring -------------------------------------------------------------------

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """P("yes") for each passage; see the class docstring for the prompt.

        Args:
            query: The question.
            passages: Passages to judge.

        Returns:
            One probability in ``(0, 1)`` per passage.
        """
        passages = check_inputs(query, passages)
        if not passages:
            return []
        self.load()
        tok, model = self._tokenizer, self._model
        query = query.strip()
        before, after = self.prompt_parts(query)
        # the query and the passages are data: special-token strings in them stay text
        at = before.rfind(f"<Query>: {query}\n")
        protected = [(at + len("<Query>: "), at + len("<Query>: ") + len(query))] if at >= 0 else []
        pre, _ = encode_prompt(tok, before, protected)
        suf = tok.encode(after, add_special_tokens=False)
        budget = self.max_length - len(pre) - len(suf)
        if budget < 1:
            raise ValueError(
                f"query too long for the judge: the prompt without the passage takes {len(pre) + len(suf)} "
                f"tokens, max_length is {self.max_length}"
            )
        docs = [list(e.ids) for e in plain_backend(tok).encode_batch([" " + p for p in passages], add_special_tokens=False)]
        seqs = [pre + d[:budget] + suf for d in docs]

        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        device = model.get_input_embeddings().weight.device
        yes = torch.tensor(self._yes_ids, device=device)
        no = torch.tensor(self._no_ids, device=device)
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        scores = [0.0] * len(seqs)
        with torch.inference_mode():
            for b in range(0, len(order), self.batch_size):
                idx = order[b : b + self.batch_size]
                width = max(len(seqs[i]) for i in idx)
                ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for row, i in enumerate(idx):  # left padding
                    n = len(seqs[i])
                    ids[row, width - n :] = torch.tensor(seqs[i], dtype=torch.long)
                    mask[row, width - n :] = 1
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                out = model(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    position_ids=pos.to(device),
                    use_cache=False,
                    **self._forward_extra(model),
                )
                last = out.logits[:, -1, :].float()
                pair = torch.stack([last[:, no].logsumexp(-1), last[:, yes].logsumexp(-1)], dim=-1)
                p_yes = pair.softmax(-1)[:, 1].tolist()
                for row, i in enumerate(idx):
                    scores[i] = p_yes[row]
        return finite_scores(scores, self.name)

    @staticmethod
    def _forward_extra(model: Any) -> dict[str, Any]:
        """Ask for the last position's logits only, where the model supports it."""
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover
            return {}
        return {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def __repr__(self) -> str:
        return f"LLMJudgeReranker(model={self.model_name!r}, qwen3_format={self.qwen3_format}, batch_size={self.batch_size}, max_length={self.max_length})"
