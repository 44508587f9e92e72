"""QGPMChatModel inside LangChain's own RAG prompts: does the answer equal the qgpm_prompt() answer?

    python benchmarks/prompt_shapes.py --shard I/2 --out runs/prompt_shapes     (I = 0, 1; resumable)
    python benchmarks/prompt_shapes.py --report --out runs/prompt_shapes > benchmarks/results/prompt_shapes_smollm2.md

Each test-split sample of the harness (multi-key needle and QA by default, 4K) is answered by
the embedded SmolLM2 through ``QGPMChatModel(method="qgpm")`` (the shipped preset) along
these routes, all with the sample's documents and question and greedy decoding:

* ``qgpm_prompt``: the marked prompt (:func:`qgpm_integrations.langchain.qgpm_prompt`), the reference;
* ``system_context``: ``create_stuff_documents_chain`` with langchain_classic's chat QA prompt
  (context in the system message, question in the human message);
* ``one_message``: the same chain with its completion QA prompt ("Use the following pieces of
  context ... Question: ... Helpful Answer:"), one human message;
* ``earlier_message``: the context in one human message, the question in a later one;
* ``history``: the chat QA prompt's system message, two turns of chat history, the question;
* ``before``: the ``system_context`` messages answered as plain chat (what the chain got when
  the chat model found no marking: standard RoPE, no QGPM).

Rows: the answer, whether it is right (the harness's metric), the shape the adapter found,
the document count and the prompt tokens. The report counts, per route, right answers and
answers identical to the ``qgpm_prompt`` route, and lists every differing answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROUTES = ("qgpm_prompt", "system_context", "one_message", "earlier_message", "history", "before")
HISTORY = [("human", "Hello, can you help me with a few questions about a text?"), ("ai", "Of course. Ask away.")]


def prompts() -> dict[str, tuple[Any, dict[str, Any]]]:
    from langchain_classic.chains.question_answering import stuff_prompt
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, SystemMessagePromptTemplate

    return {
        "system_context": (stuff_prompt.CHAT_PROMPT, {}),
        "one_message": (stuff_prompt.PROMPT, {}),
        "earlier_message": (ChatPromptTemplate.from_messages([("human", "Here are the documents:\n\n{context}"), ("human", "{question}")]), {}),
        "history": (
            ChatPromptTemplate.from_messages([
                SystemMessagePromptTemplate.from_template(stuff_prompt.system_template),
                MessagesPlaceholder("chat_history"),
                ("human", "{question}"),
            ]),
            {"chat_history": HISTORY},
        ),
    }


def _documents(sample: Any) -> list[str]:
    return list(sample.context) if not isinstance(sample.context, str) else [sample.context]


def answer_route(llm: Any, engine: Any, route: str, sample: Any) -> dict[str, Any]:
    """One answer through ``route``: the answer text and what the adapter found."""
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.documents import Document

    from qgpm_integrations.langchain import qgpm_prompt

    docs = _documents(sample)
    if route == "qgpm_prompt":
        message = llm.invoke(qgpm_prompt().invoke({"context": docs, "question": sample.question}))
    elif route == "before":
        prompt, _ = prompts()["system_context"]
        from qgpm_integrations.langchain.call_args import as_dicts

        msgs = prompt.format_messages(context="\n\n".join(docs), question=sample.question)
        res = engine.chat(as_dicts(msgs), max_new_tokens=sample.max_new_tokens)
        return {"answer": res.text, "mode": "plain", "prompt_tokens": res.usage.prompt_tokens}
    else:
        class Capture(BaseCallbackHandler):
            message: Any = None

            def on_llm_end(self, response: Any, **kw: Any) -> None:
                Capture.message = response.generations[0][0].message

        prompt, extra = prompts()[route]
        chain = create_stuff_documents_chain(llm, prompt)
        chain.invoke({"context": [Document(page_content=d) for d in docs], "question": sample.question, **extra},
                     config={"callbacks": [Capture()]})
        message = Capture.message
    info = message.response_metadata["qgpm"]
    return {
        "answer": message.content, "mode": info["mode"], "shape": info.get("prompt", {}).get("shape"),
        "documents": info.get("documents"), "prompt_tokens": message.usage_metadata["input_tokens"],
        "top_sentence": (info.get("top_sentences") or [{}])[0].get("text"),
    }


def run(args: argparse.Namespace) -> None:
    import torch

    from qgpm.eval.work import make_sample, work_items
    from qgpm.eval.scoring import is_correct
    from qgpm_integrations.langchain import QGPMChatModel
    from qgpm_integrations.langchain.chat_models import _get_engine

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shard, of = (int(x) for x in args.shard.split("/"))
    path = out / f"rows.{shard}.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["task"], r["length"], r["depth"], r["index"], r["route"]))
    engine = _get_engine(None, None)
    items = work_items(args.tasks.split(","), [int(x) for x in args.lengths.split(",")],
                       [float(x) for x in args.depths.split(",")], args.n, "test")[shard::of]
    for item in items:
        todo = [r for r in ROUTES if (item.task, item.length, item.depth, item.index, r) not in done]
        if not todo:
            continue
        sample = make_sample(engine.tokenizer, item, None, None)
        llm = QGPMChatModel(engine=engine, method="qgpm", max_tokens=sample.max_new_tokens)
        for route in todo:
            t = time.perf_counter()
            row = answer_route(llm, engine, route, sample)
            row.update(task=item.task, length=item.length, depth=item.depth, index=item.index, route=route,
                       gold=sample.answers, correct=bool(is_correct(sample.metric, row["answer"], sample.answers)),
                       wall_s=round(time.perf_counter() - t, 2))
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{item.task} {item.length} d={item.depth} i={item.index} {route}: {row['correct']} {row['answer'][:60]!r}", flush=True)


def report(args: argparse.Namespace) -> str:
    rows = [json.loads(line) for p in sorted(Path(args.out).glob("rows.*.jsonl")) for line in p.read_text().splitlines()]
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["task"], r["length"], r["depth"], r["index"]), {})[r["route"]] = r
    complete = {k: v for k, v in by.items() if all(x in v for x in ROUTES)}
    lines = ["# LangChain's RAG prompts through QGPMChatModel, against qgpm_prompt()", "",
             f"Rows made by `python benchmarks/prompt_shapes.py --shard I/2 --out {args.out}` (I = 0, 1; OMP_NUM_THREADS=1), "
             f"report by `{args.command} --report`.", "",
             f"Samples with every route answered: {len(complete)} (tasks {args.tasks}, lengths {args.lengths}, "
             f"depths {args.depths}, n {args.n}; embedded SmolLM2-135M-Instruct, shipped preset, greedy).", "",
             "| route | QGPM active | shape found | right | same answer as qgpm_prompt | same top sentence | right here, wrong there | wrong here, right there |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    n = len(complete)
    for route in ROUTES:
        rs = [v[route] for v in complete.values()]
        ref = [v["qgpm_prompt"] for v in complete.values()]
        active = sum(r["mode"] == "context" for r in rs)
        shapes = sorted({str(r.get("shape")) for r in rs})
        right = sum(r["correct"] for r in rs)
        same = sum(r["answer"].strip() == q["answer"].strip() for r, q in zip(rs, ref))
        win = sum(r["correct"] and not q["correct"] for r, q in zip(rs, ref))
        loss = sum(q["correct"] and not r["correct"] for r, q in zip(rs, ref))
        top = "-" if route == "before" else f"{sum(r.get('top_sentence') == q.get('top_sentence') for r, q in zip(rs, ref))}/{n}"
        lines.append(f"| {route} | {active}/{n} | {', '.join(shapes)} | {right}/{n} | {same}/{n} | {top} | {win} | {loss} |")
    lines += ["", "Each route gives QGPM the same documents and question; the prompt text around them differs (the "
              "template's instruction, its labels such as \"Question:\" / \"Helpful Answer:\", the history turns), so "
              "greedy answers can differ in wording while the ranking (same top sentence) agrees. `before` is the "
              "system_context prompt answered as plain chat (no QGPM), what the chain got when the chat model found "
              "no marking.", "", "## Answers that differ from the qgpm_prompt route", ""]
    for key in sorted(complete, key=str):
        v = complete[key]
        ref = v["qgpm_prompt"]["answer"].strip()
        diffs = [(r, v[r]) for r in ROUTES[1:] if v[r]["answer"].strip() != ref]
        if not diffs:
            continue
        lines.append(f"- {key[0]} {key[1]} depth {key[2]} sample {key[3]} (gold {v['qgpm_prompt']['gold']}): "
                     f"qgpm_prompt {ref!r} ({'right' if v['qgpm_prompt']['correct'] else 'wrong'})")
        for r, x in diffs:
            lines.append(f"  - {r}: {x['answer'].strip()!r} ({'right' if x['correct'] else 'wrong'})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="niah_multikey_1,qa_1")
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--depths", default="0.25,0.5,0.75")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--shard", default="0/1", help="I/P: every P-th sample from the I-th")
    ap.add_argument("--out", default="runs/prompt_shapes")
    ap.add_argument("--report", action="store_true", help="print the markdown report of the rows in --out")
    args = ap.parse_args(argv)
    if args.report:
        args.command = "python benchmarks/prompt_shapes.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report")
        sys.stdout.write(report(args))
    else:
        run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
