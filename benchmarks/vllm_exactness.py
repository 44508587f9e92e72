"""Greedy answers through the vLLM generator against the in-process engine.

    bash scripts/vllm_server.sh --port 8000 &     # wait for http://127.0.0.1:8000/v1/models
    # the bundled questions, token ids compared call by call:
    python benchmarks/vllm_exactness.py bundled --url http://127.0.0.1:8000 --methods vanilla,qgpm,reorder
    # two eval runs of the same samples, in process and with --vllm-url, answers compared row by row
    # (run folders or their rows.jsonl files):
    python benchmarks/vllm_exactness.py runs IN_PROCESS_RUN VLLM_RUN

``bundled``: each bundled question (``qgpm ask --example``) is prepared once in process and
generated twice from the same prepared call, by the engine's own generator and by the server
(40 new tokens, greedy); the new token ids must be equal. ``runs``: rows of two ``qgpm eval``
folders are matched by sample and method and their answers compared. Both print a table per
method: calls, identical, and each difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def bundled(url: str, methods: list[str], new_tokens: int) -> list[str]:
    from qgpm import QGPM
    from qgpm.cli import sample_document
    from qgpm.decoding import Decoding
    from qgpm.serving import VLLMServer

    engine = QGPM.from_pretrained()
    server = VLLMServer(url)
    server.attach(engine)
    text, questions = sample_document()
    dec = Decoding.check(max_new_tokens=new_tokens)
    same: dict[str, int] = defaultdict(int)
    diffs: list[str] = []
    for i, q in enumerate(questions):
        for m in methods:
            kw = {"evidence": [q["evidence"]]} if m == "oracle" else {}
            call = engine.prepare(text, q["question"], method=m, max_new_tokens=new_tokens, **kw)
            a = engine.local.generate(call, dec)
            b = server.generate(call, dec)
            if a.token_ids == b.token_ids:
                same[m] += 1
            else:
                diffs.append(f"question {i}, {m}: in process {a.text[:80]!r} / vLLM {b.text[:80]!r}")
            print(i, m, a.token_ids == b.token_ids, repr(a.text[:60]), flush=True)
    lines = ["| method | bundled questions | identical token ids |", "|---|---|---|"]
    lines += [f"| {m} | {len(questions)} | {same[m]} |" for m in methods]
    return lines + [""] + [f"- {d}" for d in diffs]


def runs(a_dir: str, b_dir: str) -> list[str]:
    def load(d: str) -> dict:
        path = Path(d) / "rows.jsonl" if Path(d).is_dir() else Path(d)  # a run folder or a rows file
        rows = (json.loads(line) for line in open(path, encoding="utf-8"))
        return {(r["task"], r["length"], r["depth"], r["index"], r["method"]): r for r in rows if not r.get("error")}

    a, b = load(a_dir), load(b_dir)
    keys = sorted(set(a) & set(b))
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    diffs = []
    for k in keys:
        per[k[4]][0] += 1
        if a[k]["answer"] == b[k]["answer"]:
            per[k[4]][1] += 1
        else:
            diffs.append(f"{k}: {a[k]['answer'][:80]!r} / {b[k]['answer'][:80]!r}")
    tasks = sorted({k[0] for k in keys})
    lines = [f"Samples: {len({k[:4] for k in keys})} ({', '.join(tasks)}).", "", "| method | calls | identical answers |", "|---|---|---|"]
    lines += [f"| {m} | {n} | {s} |" for m, (n, s) in sorted(per.items())]
    return lines + [""] + [f"- {d}" for d in diffs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bundled")
    b.add_argument("--url", required=True)
    b.add_argument("--methods", default="vanilla,qgpm,reorder")
    b.add_argument("--new-tokens", type=int, default=40)
    r = sub.add_parser("runs")
    r.add_argument("in_process")
    r.add_argument("vllm")
    args = ap.parse_args(argv)
    if args.what == "bundled":
        lines = bundled(args.url, args.methods.split(","), args.new_tokens)
    else:
        lines = runs(args.in_process, args.vllm)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
