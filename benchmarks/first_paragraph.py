"""Committed rows rescored with the harness's plain-text stop rule (the answer is its first
paragraph, ``qgpm.eval.answering.PLAIN_TEXT_STOP``), beside their stored scores.

A model prompted as plain text has no end of turn and writes on past its answer; rows made
before the rule scored the whole 48-token text, so a later line could carry the gold string
after a wrong first answer. Greedy decoding makes the first paragraph of a stored answer the
answer the rule would have produced, except where the raw answer began with a blank line (the
stored text is stripped, so that case cannot be told apart here and such an answer keeps its
first paragraph instead of ending empty).

    python benchmarks/first_paragraph.py benchmarks/results/eval_gemma3_270m_test/rows.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from qgpm.decoding import cut_at_stop
from qgpm.eval.answering import PLAIN_TEXT_STOP
from qgpm.eval.scoring import is_correct


def first_paragraph(answer: str) -> str:
    """``answer`` cut where the harness's stop would have ended it, stripped as the engine strips."""
    return cut_at_stop(answer, PLAIN_TEXT_STOP)[0].strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", type=Path)
    a = ap.parse_args()
    stored: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # n, stored right, rescored right, run on
    for line in a.rows.read_text().splitlines():
        r = json.loads(line)
        if r.get("answer") is None:
            continue
        key = (r["task"], r["length"], r["method"], r["config_hash"])
        cut = first_paragraph(r["answer"])
        s = stored[key]
        s[0] += 1
        s[1] += bool(r["correct"])
        s[2] += is_correct(r["metric"], cut, r["gold"])
        s[3] += cut != r["answer"].strip()
    print("| task | length | method | series | n | right as stored | right, first paragraph | answers that ran on |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for (task, length, method, h), (n, old, new, ran) in sorted(stored.items()):
        print(f"| {task} | {length} | {method} | {h[:6]} | {n} | {old} | {new} | {ran} |")


if __name__ == "__main__":
    main()
