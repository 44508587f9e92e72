# dev-split pass-1 diagnostic: where the heads rank the queried key's needle under pass-1 settings
import json, sys, torch
torch.set_num_threads(1)
from qgpm.eval.answering import prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.eval.work import make_sample, work_items
from qgpm.config_files import coerce_value
eng = load_engine("smollm2", device="cpu", dtype="float32")
variants = [dict(kv.split("=", 1) for kv in v.split(";") if kv) for v in sys.argv[2].split("|")]
out = open(sys.argv[3], "a")
for it in work_items(sys.argv[1].split(","), [4096], [0.25, 0.5, 0.75], int(sys.argv[4]), "dev"):
    s = make_sample(eng.tokenizer, it, None, 48)
    for v in variants:
        cfg = eng.config.with_(**{k: coerce_value(x) for k, x in v.items()})
        call = eng.prepare(s.context, s.question, **prepare_kwargs(s, "qgpm", config=cfg))
        ev = [r.rank for r in call.relevance if any(e.strip() in r.text for e in s.evidence)]
        out.write(json.dumps(dict(task=it.task, depth=it.depth, index=it.index, variant=v, evidence_ranks=sorted(ev))) + "\n"); out.flush()
        print(it.task, it.depth, it.index, v, sorted(ev), flush=True)
