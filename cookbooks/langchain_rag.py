"""RAG with LangChain and QGPM: LangChain's standard retrieval chain, four ways to answer.

A real vector store (``langchain_core.vectorstores.InMemoryVectorStore``) indexes the
bundled corpus (``cookbooks/data/corpus/*.md``, split into paragraphs) with the bundled
all-MiniLM-L6-v2 embeddings. Each question of ``cookbooks/data/questions.json`` is then
answered by the embedded SmolLM2-135M-Instruct through the chain LangChain's docs teach,
unchanged::

    prompt = ChatPromptTemplate.from_messages([("system", "... context ...\n\n{context}"), ("human", "{input}")])
    chain = create_retrieval_chain(retriever, create_stuff_documents_chain(llm, prompt))
    chain.invoke({"input": question})["answer"]

``QGPMChatModel`` finds the context (the system message after its instruction) and the
question (the human message) by itself. Side by side:

* ``vanilla`` -- the retrieved paragraphs as they come, standard RoPE;
* ``qgpm``    -- the same paragraphs, the sentences most relevant to the question moved next
  to it by their positions (ranked with MiniLM: the embedded SmolLM2's preset and the
  recipe every other model gets; the script prints the sentences QGPM ranked highest and what
  its plan did with each, read through ``QGPMTrace``);
* ``topk``    -- a ``ContextualCompressionRetriever`` with ``QGPMTopKCompressor`` as the
  chain's retriever (keeps the best paragraphs in their original order), standard RoPE;
* ``reorder`` -- the same with ``QGPMReorder`` (best paragraph last, next to the question).

Everything runs offline on CPU.

Run:  python cookbooks/langchain_rag.py [--limit 2] [--k 24] [--max-tokens 32]
      (a copy outside the checkout: add --data /path/to/qgpm/cookbooks/data)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from langchain_classic.chains import create_retrieval_chain  # noqa: E402
from langchain_classic.chains.combine_documents import create_stuff_documents_chain  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402

from qgpm.defaults import COMPARISON_METHODS, DEFAULT_RERANKER  # noqa: E402
from qgpm_integrations.langchain import (  # noqa: E402
    MiniLMEmbeddings,
    QGPMChatModel,
    QGPMReorder,
    QGPMTopKCompressor,
    QGPMTrace,
)

DATA = Path(__file__).resolve().parent / "data"
METHODS = tuple(m for m in COMPARISON_METHODS if m != "oracle")  # the oracle needs evidence labels

# The usual RAG prompt of a retrieval chain: instructions and the stuffed documents in the
# system message, the question as the human message. Nothing in it is specific to QGPM.
RAG_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You answer questions about a small town. Use the following pieces of retrieved context to answer. "
               "If the context does not say, say that you don't know. Keep the answer short.\n\n{context}"),
    ("human", "{input}"),
])


def load_corpus(folder: Path = DATA / "corpus") -> list[Document]:
    """Every paragraph of every corpus file as a Document (metadata: source, title)."""
    docs: list[Document] = []
    for path in sorted(folder.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        title = ""
        for i, para in enumerate(p.strip() for p in re.split(r"\n\s*\n", text)):
            if not para:
                continue
            if para.startswith("#"):
                title = para.lstrip("#").strip()
                continue
            docs.append(Document(page_content=para, metadata={"source": path.name, "title": title, "paragraph": i}))
    return docs


def build_vector_store(docs: Sequence[Document] | None = None, embeddings: Any = None) -> InMemoryVectorStore:
    """An in-memory vector store over the corpus paragraphs (bundled MiniLM embeddings)."""
    store = InMemoryVectorStore(embeddings or MiniLMEmbeddings())
    store.add_documents(list(docs if docs is not None else load_corpus()))
    return store


def build_chains(retriever: Any, *, max_tokens: int = 32, heads: Any = None, reranker: str = DEFAULT_RERANKER, top_k: int = 3,
                 vllm_url: str | None = None) -> dict[str, Any]:
    """The four side-by-side retrieval chains (LangChain's standard form). All chat models share one loaded model;
    with ``vllm_url`` they generate on that vLLM server (pass 1 stays here)."""
    from langchain_classic.retrievers import ContextualCompressionRetriever

    qgpm_llm = QGPMChatModel(method="qgpm", max_tokens=max_tokens, heads=heads, vllm_url=vllm_url)
    plain_llm = QGPMChatModel(method="vanilla", max_tokens=max_tokens, heads=heads, vllm_url=vllm_url)
    topk = ContextualCompressionRetriever(base_compressor=QGPMTopKCompressor(reranker=reranker, k=top_k), base_retriever=retriever)
    reorder = ContextualCompressionRetriever(base_compressor=QGPMReorder(reranker=reranker), base_retriever=retriever)

    def chain(ret: Any, llm: QGPMChatModel) -> Any:
        return create_retrieval_chain(ret, create_stuff_documents_chain(llm, RAG_PROMPT))

    return {
        "vanilla": chain(retriever, plain_llm),
        "qgpm": chain(retriever, qgpm_llm),
        "topk": chain(topk, plain_llm),
        "reorder": chain(reorder, plain_llm),
    }


def run(questions: Sequence[dict], chains: dict[str, Any], methods: Sequence[str] = METHODS, show: int = 3, out=None) -> list[dict]:
    """Answer every question with every method; print a side-by-side report."""
    out = out or sys.stdout
    rows = []
    for n, q in enumerate(questions, 1):
        print(f"\n[{n}] {q['question']}   (expected: {q['answer']})", file=out)
        row = {"question": q["question"], "answer": q["answer"]}
        for m in methods:
            trace = QGPMTrace()
            t = time.perf_counter()
            text = chains[m].invoke({"input": q["question"]}, config={"callbacks": [trace]})["answer"]
            dt = time.perf_counter() - t
            ok = q["answer"].lower() in text.lower()
            row[m] = {"text": text, "correct": ok, "seconds": round(dt, 2), "mode": trace.last["mode"]}
            print(f"  {m:<8} {'OK ' if ok else '-- '} {text!r}  ({dt:.1f}s)", file=out)
            if m == "qgpm":
                info = trace.last
                if info["mode"] != "context":
                    raise RuntimeError(f"QGPM did not find the context in the prompt: {info.get('reason')}")
                print(f"           QGPM ranked highest (of {info.get('documents')} retrieved paragraphs):", file=out)
                for s in info.get("top_sentences", [])[:show]:
                    star = "*" if q.get("evidence") and s["text"].strip() in q["evidence"] else " "
                    plan = "promoted" if s["promoted"] else "term filter" if s["term_dropped"] else "left in place"
                    print(f"           {star}#{s['rank'] + 1} z={s['z']:+.2f} doc={s['doc']} {plan:<13} {s['text'][:100]}", file=out)
        rows.append(row)
    print("\naccuracy: " + "  ".join(f"{m}={sum(r[m]['correct'] for r in rows)}/{len(rows)}" for m in methods), file=out)
    return rows


def main(argv: Sequence[str] | None = None, *, heads: Any = None) -> list[dict]:
    """Command-line entry point; ``heads`` (a list of (layer, head)) overrides ``--heads``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="answer only the first N questions")
    ap.add_argument("--k", type=int, default=24,
                    help="paragraphs retrieved per question (default 24: about 1,400 tokens; the preset keeps the model's own "
                         "positions for contexts up to keep_length = 1,024 tokens)")
    ap.add_argument("--top-k", type=int, default=3, help="paragraphs kept by the Top-K compressor")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reranker", default=DEFAULT_RERANKER, help=f"qgpm.rerank spec for Top-K / Reorder (bm25, minilm, judge, ...; default {DEFAULT_RERANKER})")
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

    t = time.perf_counter()
    store = build_vector_store(load_corpus(args.data / "corpus"))
    retriever = store.as_retriever(search_kwargs={"k": args.k})
    chains = build_chains(retriever, max_tokens=args.max_tokens, heads=heads if heads is not None else args.heads, reranker=args.reranker, top_k=args.top_k,
                          vllm_url=args.vllm_url)
    print(f"indexed {len(store.store)} paragraphs in {time.perf_counter() - t:.1f}s; retrieving {args.k} per question")
    t = time.perf_counter()
    QGPMChatModel(heads=heads if heads is not None else args.heads, vllm_url=args.vllm_url).get_engine()  # load once, before timing answers
    print(f"model ready in {time.perf_counter() - t:.1f}s")
    rows = run(questions, chains, methods)
    if args.json:  # the folder was checked before any question was answered
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
