"""RAG with LlamaIndex and QGPM: one index, four ways to answer.

A ``VectorStoreIndex`` indexes the bundled corpus (``cookbooks/data/corpus/*.md``, split by
``SentenceSplitter`` into ~128-token nodes, sizes measured with the model's own tokenizer)
with the bundled all-MiniLM-L6-v2 embeddings. Each question of
``cookbooks/data/questions.json`` is then answered by the embedded SmolLM2-135M-Instruct,
side by side, through four query engines over the same retriever:

* ``vanilla`` -- ``QGPMLLM(method="vanilla")``: the retrieved nodes as they come,
  standard RoPE;
* ``qgpm``    -- ``QGPMLLM(method="qgpm")``: the same nodes, the sentences most relevant to
  the question moved next to it by their positions (ranked with MiniLM: the embedded
  SmolLM2's preset and the recipe every other model gets; the script prints the sentences QGPM
  ranked highest and what its plan did with each, from ``response.metadata["qgpm"]``);
* ``topk``    -- ``QGPMTopKPostprocessor`` (keeps the best nodes in their original
  order) + the vanilla LLM;
* ``reorder`` -- ``QGPMReorderPostprocessor`` (best node last, next to the question) +
  the vanilla LLM.

All LLMs share one loaded model. Everything runs offline on CPU::

    llm = QGPMLLM(engine=engine, method="qgpm")
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=10)
    response = query_engine.query("Who is the reading room named after?")
    print(response, response.metadata["qgpm"].explain(3))

Run:  python cookbooks/llama_index_rag.py [--limit 2] [--k 10] [--max-tokens 32] [--response-mode compact]
      (a copy outside the checkout: add --data /path/to/qgpm/cookbooks/data)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402

from qgpm import QGPM, HeadSetMissingError  # noqa: E402
from qgpm.defaults import COMPARISON_METHODS, DEFAULT_RERANKER  # noqa: E402
from qgpm.explain import decision_note  # noqa: E402
from qgpm.serving import VLLMServer  # noqa: E402
from qgpm.sources import parse_source  # noqa: E402
from qgpm_integrations.llama_index import (  # noqa: E402
    QGPMLLM,
    QGPMReorderPostprocessor,
    QGPMTopKPostprocessor,
    bundled_embeddings,
    set_tokenizer,
)

DATA = Path(__file__).resolve().parent / "data"
METHODS = tuple(m for m in COMPARISON_METHODS if m != "oracle")  # the oracle needs evidence labels
RESPONSE_MODES = ("compact", "refine", "tree_summarize", "simple_summarize")


def load_documents(folder: Path = DATA / "corpus") -> list[Document]:
    """One Document per corpus file (metadata: file_name, title; the LLM sees neither)."""
    docs = []
    for path in sorted(folder.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        title = next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")), path.stem)
        docs.append(
            Document(
                text=text,
                metadata={"file_name": path.name, "title": title},
                excluded_llm_metadata_keys=["file_name", "title"],
                excluded_embed_metadata_keys=["file_name"],
            )
        )
    return docs


def build_index(engine: QGPM, documents: Sequence[Document] | None = None, *, chunk_size: int = 128, embed_model: Any = None) -> VectorStoreIndex:
    """A VectorStoreIndex over the corpus; chunk sizes counted with the model's tokenizer."""
    set_tokenizer(engine, force=True)  # before the splitter is built: no tiktoken anywhere
    splitter = SentenceSplitter(chunk_size=chunk_size, chunk_overlap=0)
    return VectorStoreIndex.from_documents(
        list(documents if documents is not None else load_documents()),
        embed_model=embed_model or bundled_embeddings(),
        transformations=[splitter],
    )


def build_query_engines(
    index: VectorStoreIndex,
    engine: QGPM,
    *,
    k: int = 4,
    top_n: int = 2,
    max_tokens: int = 32,
    reranker: str = DEFAULT_RERANKER,
    response_mode: str = "compact",
    methods: Sequence[str] = METHODS,
) -> dict[str, Any]:
    """The side-by-side query engines. All LLMs share ``engine``."""
    vanilla = QGPMLLM(engine=engine, method="vanilla", max_new_tokens=max_tokens)
    out: dict[str, Any] = {}
    common = dict(similarity_top_k=k, response_mode=response_mode)
    if "vanilla" in methods:
        out["vanilla"] = index.as_query_engine(llm=vanilla, **common)
    if "qgpm" in methods:
        out["qgpm"] = index.as_query_engine(llm=QGPMLLM(engine=engine, method="qgpm", max_new_tokens=max_tokens), **common)
    if "topk" in methods:
        out["topk"] = index.as_query_engine(llm=vanilla, node_postprocessors=[QGPMTopKPostprocessor(reranker=reranker, top_n=top_n)], **common)
    if "reorder" in methods:
        out["reorder"] = index.as_query_engine(llm=vanilla, node_postprocessors=[QGPMReorderPostprocessor(reranker=reranker)], **common)
    return out


def run(questions: Sequence[dict], engines: dict[str, Any], show: int = 3, out=sys.stdout) -> list[dict]:
    """Answer every question with every query engine; print a side-by-side report."""
    methods = list(engines)
    rows = []
    for n, q in enumerate(questions, 1):
        print(f"\n[{n}] {q['question']}   (expected: {q['answer']})", file=out)
        row: dict[str, Any] = {"question": q["question"], "answer": q["answer"]}
        for m in methods:
            t = time.perf_counter()
            response = engines[m].query(q["question"])
            dt = time.perf_counter() - t
            text = str(response)
            ok = q["answer"].lower() in text.lower()
            files = [x.node.metadata.get("file_name", "?") for x in response.source_nodes]
            row[m] = {"text": text, "correct": ok, "seconds": round(dt, 2), "sources": files}
            print(f"  {m:<8} {'OK ' if ok else '-- '} {text!r}  ({dt:.1f}s)", file=out)
            if m in ("topk", "reorder"):
                print(f"           nodes given to the model: {[f'{f} ({s.score:.2f})' for f, s in zip(files, response.source_nodes)]}", file=out)
            trace = (response.metadata or {}).get("qgpm")
            if m == "qgpm" and trace:
                result = trace.result
                print(f"           QGPM ranked highest (of {len(result.relevance)} sentences in {len(files)} nodes; paragraph: "
                      "the paragraph of the context, a node's own paragraphs counted apart):", file=out)
                for s in result.top_sentences(show):
                    star = "*" if q.get("evidence") and s.text.strip() in q["evidence"] else " "
                    plan = "promoted" if s.promoted else "term filter" if s.term_dropped else "left in place"
                    print(f"           {star}#{s.rank + 1} z={s.z:+.2f} paragraph={s.doc} {plan:<13} {s.text[:100]}", file=out)
                note = decision_note(result.details, "qgpm")
                if note:
                    print(f"           note: {note}", file=out)
        rows.append(row)
    print("\naccuracy: " + "  ".join(f"{m}={sum(r[m]['correct'] for r in rows)}/{len(rows)}" for m in methods), file=out)
    return rows


def main(argv: Sequence[str] | None = None, *, engine: QGPM | None = None) -> list[dict]:
    """Command-line entry point; ``engine`` reuses an already loaded :class:`qgpm.QGPM`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="answer only the first N questions")
    ap.add_argument("--k", type=int, default=10,
                    help="nodes retrieved per question (default 10: about 1,000-1,300 tokens of context; the preset keeps "
                         "the model's own positions for contexts up to keep_length = 1,024 tokens, and the report then says so)")
    ap.add_argument("--top-n", type=int, default=2, help="nodes kept by the Top-K postprocessor")
    ap.add_argument("--chunk-size", type=int, default=128, help="node size in model tokens")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reranker", default=DEFAULT_RERANKER, help=f"qgpm.rerank spec for Top-K / Reorder (bm25, minilm, judge, ...; default {DEFAULT_RERANKER})")
    ap.add_argument("--response-mode", default="compact", choices=RESPONSE_MODES)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    ap.add_argument("--heads", default=None, help="head-set JSON for QGPM (default: the stored set); read only by a config that ranks with the heads (relevance='heads')")
    ap.add_argument("--json", default=None, help="write the answers to this JSON file")
    ap.add_argument("--data", type=Path, default=DATA, help=f"the folder of questions.json and corpus/*.md (default: {DATA})")
    ap.add_argument("--vllm-url", default=None, help="generate on this vLLM server (bash scripts/vllm_server.sh --port 8000)")
    args = ap.parse_args(argv)
    if args.json and not Path(args.json).resolve().parent.is_dir():  # before any question is answered
        ap.error(f"--json {args.json}: the folder {Path(args.json).resolve().parent} does not exist")
    if not (args.data / "questions.json").is_file() or not (args.data / "corpus").is_dir():
        ap.error(f"--data {args.data}: no questions.json and corpus/ there (the cookbooks' data is cookbooks/data in the "
                 "qgpm checkout; pass --data PATH to it when the script runs from elsewhere)")

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown methods {bad}; choose from {METHODS}")
    questions = json.loads((args.data / "questions.json").read_text(encoding="utf-8"))[: args.limit]

    if engine is None:
        generator = VLLMServer(args.vllm_url) if args.vllm_url else None  # pass 2 on the server, pass 1 here
        engine = QGPM.from_pretrained(heads=args.heads, generator=generator, reuse_prefill=generator is None)
    if "qgpm" in methods and parse_source(engine.config.relevance).heads and engine.head_set is None:
        raise HeadSetMissingError("no stored head set for this model: pass --heads <head-set.json> or drop qgpm from --methods")

    t = time.perf_counter()
    index = build_index(engine, load_documents(args.data / "corpus"), chunk_size=args.chunk_size)
    engines = build_query_engines(
        index, engine, k=args.k, top_n=args.top_n, max_tokens=args.max_tokens, reranker=args.reranker,
        response_mode=args.response_mode, methods=methods,
    )
    print(f"indexed {len(index.docstore.docs)} nodes in {time.perf_counter() - t:.1f}s; retrieving {args.k} per question, "
          f"response mode {args.response_mode}")
    rows = run(questions, engines)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
