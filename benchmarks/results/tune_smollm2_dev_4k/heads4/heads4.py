# dev-split pass-1 diagnostic: the 8 shipped heads against the 4 best
# (max_heads=4, deepest layer 18) on all five tasks: where the evidence ranks, the top-three z,
# and which calls the preset's rules (min_top_z, decisive_margin, solo_margin 0.4) would send
# to vanilla positions or to one sentence. Pass 1 only, no answers.
#   python heads4.py TASKS N OUT.jsonl SHARD/NSHARDS
import json, sys, torch
torch.set_num_threads(1)
from qgpm.eval.answering import prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.eval.work import make_sample, work_items
eng = load_engine("smollm2", device="cpu", dtype="float32")
tasks = sys.argv[1].split(","); n = int(sys.argv[2])
try:  # resumable: skip the (sample, head set) rows OUT already holds
    done = {(r["task"], r["depth"], r["index"], r["max_heads"]) for r in map(json.loads, open(sys.argv[3]))}
except FileNotFoundError:
    done = set()
out = open(sys.argv[3], "a")
i, k = (int(x) for x in sys.argv[4].split("/"))
items = work_items(tasks, [4096], [0, 0.25, 0.5, 0.75, 1], n, "dev")[i::k]
for it in items:
    s = make_sample(eng.tokenizer, it, None, 48)
    for heads in (None, 4):
        if (it.task, float(it.depth), it.index, heads) in done:
            continue
        cfg = eng.config.with_(max_heads=heads, solo_margin=0.4)
        call = eng.prepare(s.context, s.question, **prepare_kwargs(s, "qgpm", config=cfg))
        rel = sorted(call.relevance, key=lambda r: r.rank)
        ev = [r.rank for r in rel if any(e.strip() in r.text or r.text.strip() in e for e in s.evidence)]
        rec = dict(task=it.task, depth=it.depth, index=it.index, max_heads=heads, evidence_ranks=ev[:4],
                   top_z=[round(float(r.z), 3) for r in rel[:3]],
                   details={k2: call.details.get(k2) for k2 in ("flat_relevance", "decisive_relevance", "solo_relevance", "layers_run")})
        out.write(json.dumps(rec) + "\n"); out.flush()
        print(it.task, it.depth, it.index, heads, ev[:4], rec["top_z"], rec["details"], flush=True)
