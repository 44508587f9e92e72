"""Which eval samples the splitter's run-on rule (``QGPMConfig.split_run_ons``) changes.

    python benchmarks/run_on_units.py --split test --lengths 4096 --out benchmarks/results/run_on/units_test.md \
        --ids-out benchmarks/results/run_on/ids_test.jsonl --set niah_multikey_1:12 --set niah_multivalue:6 ...

Generates every sample (the embedded model's tokenizer fits its token budget; no model run)
and splits its context with and without the rule, as the engine's prompt builder does
(:func:`qgpm.segment.split_documents` on the checked documents), comparing the sentence units. A sample whose units are the same gets the same
relevance, plan and answer under either setting (pass 1 reads the same tokens; only the
units it is summed over could differ), so only the changed samples need answering. Writes a
table per (task, depth) and the changed samples' ids (task, length, depth, index) with
the unit the rule split off.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from qgpm.eval.work import make_sample, work_items
from qgpm.loading import load_tokenizer, resolve_source
from qgpm.prompt import check_prompt_inputs
from qgpm.segment import split_documents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="test")
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--set", dest="sets", action="append", required=True, metavar="TASK:N", help="a task and its samples per depth")
    ap.add_argument("--haystack", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", required=True, help="the table (markdown)")
    ap.add_argument("--ids-out", default=None, help="the changed samples' ids as JSONL, for `qgpm eval --only`")
    a = ap.parse_args()
    tok = load_tokenizer(resolve_source(None))
    depths = [float(d) for d in a.depths.split(",")]
    table: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    changed = []
    for spec in a.sets:
        task, _, n = spec.partition(":")
        for item in work_items([task], [int(x) for x in a.lengths.split(",")], depths, int(n), a.split):
            s = make_sample(tok, item, a.haystack, a.max_new_tokens)
            spec_ = s.prompt_spec()
            docs = check_prompt_inputs(spec_.context, spec_.question, instruction=spec_.instruction, answer_prefix=spec_.answer_prefix)
            old = [u.text for u in split_documents(docs, spec_.document_separator)[1]]
            new = [u.text for u in split_documents(docs, spec_.document_separator, run_ons=True)[1]]
            cell = table[(task, item.length, item.depth)]
            cell[1] += 1
            if old != new:
                cell[0] += 1
                split_off = [u for u in new if u not in set(old)]
                changed.append({"task": task, "length": item.length, "depth": item.depth, "index": item.index, "seed": item.seed,
                                "units_before": len(old), "units_after": len(new), "new_units": split_off[:4]})
    lines = [f"# Samples whose units the run-on rule changes ({a.split} split)", "",
             f"Command: `python benchmarks/run_on_units.py --split {a.split} --lengths {a.lengths} --depths {a.depths} "
             + " ".join(f"--set {x}" for x in a.sets) + (f" --haystack {a.haystack}" if a.haystack else "") + f" --out {a.out}"
             + (f" --ids-out {a.ids_out}" if a.ids_out else "") + "`", "",
             "| task | length | depth | changed | samples |", "|---|---|---|---|---|"]
    for (task, length, depth), (c, n) in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] if kv[0][2] is not None else -1)):
        lines.append(f"| {task} | {length} | {depth} | {c} | {n} |")
    lines += ["", "Changed samples (the first new units):", "", "```"]
    lines += [json.dumps(c) for c in changed]
    lines += ["```", ""]
    Path(a.out).write_text("\n".join(lines))
    if a.ids_out:
        Path(a.ids_out).write_text("".join(json.dumps(c) + "\n" for c in changed))
    print("\n".join(lines[:len(table) + 6]))


if __name__ == "__main__":
    main()
