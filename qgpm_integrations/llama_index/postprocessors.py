"""Input-editing baselines (paper Sec. 5.3) as LlamaIndex node postprocessors.

* :class:`QGPMTopKPostprocessor` keeps the ``top_n`` best nodes **in their original
  (retrieval) order** -- unlike ``SentenceTransformerRerank``, which sorts by score.
* :class:`QGPMReorderPostprocessor` keeps every node, sorted by ascending score so the
  best node comes **last**, right before the question -- unlike LlamaIndex's
  ``LongContextReorder``, which puts the best nodes at both ends.

Both score nodes with a :mod:`qgpm.rerank` reranker (``"bm25"``, ``"minilm"``, ``"judge"``,
``"cross-encoder:<id>"``, or a :class:`qgpm.rerank.Reranker` object) and set
``node.score`` to the reranker score (the retrieval score is kept in
``node.metadata["retrieval_score"]`` with ``keep_retrieval_score=True``). Ties follow
:func:`qgpm.editing.topk_order` / :func:`qgpm.editing.reorder_order`: Top-K prefers the
earlier node, Reorder keeps tied nodes in their original order. The input list and its
``NodeWithScore`` objects are not modified.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, List, Optional

from llama_index.core.bridge.pydantic import ConfigDict, Field, field_validator, model_validator
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from qgpm.defaults import DEFAULT_K, DEFAULT_RERANKER
from qgpm.editing import reorder_order, topk_order
from qgpm.rerank import check_reranker_spec, get_reranker

__all__ = ["QGPMTopKPostprocessor", "QGPMReorderPostprocessor"]


class _QGPMRerankBase(BaseNodePostprocessor):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    reranker: Any = Field(default=DEFAULT_RERANKER, description="qgpm.rerank spec (bm25, minilm, judge, cross-encoder:<id>) or a Reranker.")
    metadata_mode: MetadataMode = Field(default=MetadataMode.EMBED, description="Which node text the reranker reads.")
    keep_retrieval_score: bool = Field(default=False, description="Keep the retriever's score in metadata['retrieval_score'].")

    # names other postprocessors use for a setting of this one -> what to pass instead
    _ALIASES: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown(cls, values: Any) -> Any:
        """``TypeError`` naming every argument that is no field (and the field meant, for a known alias)."""
        if isinstance(values, dict):
            values = {k: v for k, v in values.items() if k != "class_name"}  # to_dict() writes it; from_dict() drops it too
            unknown = sorted(k for k in values if k not in cls.model_fields)
            if unknown:
                hints = "; ".join(f"{k}: {cls._ALIASES[k]}" for k in unknown if k in cls._ALIASES)
                raise TypeError(f"{cls.class_name()} got unexpected arguments {unknown}" + (f" ({hints})" if hints else "")
                                + f"; it takes {', '.join(sorted(cls.model_fields))}")
        return values

    @field_validator("reranker")
    @classmethod
    def _known_reranker(cls, v: Any) -> Any:
        return check_reranker_spec(v)  # an unknown spec fails here, not at the first query

    def _score(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle]) -> list[float]:
        if query_bundle is None:
            raise ValueError(f"{self.class_name()} needs the query (query_bundle is None)")
        texts = [n.node.get_content(metadata_mode=self.metadata_mode) for n in nodes]
        scores = get_reranker(self.reranker).score(query_bundle.query_str, texts)
        if len(scores) != len(nodes):
            raise ValueError(f"got {len(scores)} scores for {len(nodes)} nodes")
        return scores

    def _rescored(self, nodes: List[NodeWithScore], scores: list[float], order: list[int]) -> List[NodeWithScore]:
        out = []
        for i in order:
            node = nodes[i].node
            if self.keep_retrieval_score:
                node = node.model_copy(deep=False)
                node.metadata = {**node.metadata, "retrieval_score": nodes[i].score}
            out.append(NodeWithScore(node=node, score=float(scores[i])))
        return out

    def _run(
        self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle], rule: Callable[[list[float]], list[int]], top_k: Optional[int]
    ) -> List[NodeWithScore]:
        if not nodes:
            return []
        payload = {EventPayload.NODES: nodes, EventPayload.MODEL_NAME: str(getattr(self.reranker, "name", self.reranker))}
        if query_bundle is not None:
            payload[EventPayload.QUERY_STR] = query_bundle.query_str
        if top_k is not None:
            payload[EventPayload.TOP_K] = top_k
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            scores = self._score(nodes, query_bundle)
            new_nodes = self._rescored(nodes, scores, rule(scores))
            event.on_end(payload={EventPayload.NODES: new_nodes})
        return new_nodes


class QGPMTopKPostprocessor(_QGPMRerankBase):
    """Keep the ``top_n`` nodes the reranker scores highest, in their original order."""

    top_n: int = Field(default=DEFAULT_K, gt=0, description="Nodes to keep.")

    _ALIASES: ClassVar[dict[str, str]] = {n: "the number of nodes kept is top_n=..." for n in ("top_k", "k", "similarity_top_k")}

    @classmethod
    def class_name(cls) -> str:
        return "QGPMTopKPostprocessor"

    def _postprocess_nodes(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        return self._run(nodes, query_bundle, lambda scores: topk_order(scores, self.top_n), self.top_n)


class QGPMReorderPostprocessor(_QGPMRerankBase):
    """Keep every node, sorted by ascending reranker score: the best node comes last."""

    _ALIASES: ClassVar[dict[str, str]] = {
        n: "Reorder keeps every node; to keep the best ones use QGPMTopKPostprocessor(top_n=...)" for n in ("top_n", "top_k", "k")
    }

    @classmethod
    def class_name(cls) -> str:
        return "QGPMReorderPostprocessor"

    def _postprocess_nodes(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        return self._run(nodes, query_bundle, reorder_order, None)
