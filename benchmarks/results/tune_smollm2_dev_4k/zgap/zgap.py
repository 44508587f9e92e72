# dev-split pass-1 analysis: z of evidence vs look-alike needles
import json, sys, torch
torch.set_num_threads(1)
from qgpm.eval.answering import prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.eval.work import make_sample, work_items
eng = load_engine("smollm2", device="cpu", dtype="float32")
tasks = sys.argv[1].split(","); n = int(sys.argv[2]); out = open(sys.argv[3], "a")
for it in work_items(tasks, [4096], [0.25, 0.5, 0.75], n, "dev"):
    s = make_sample(eng.tokenizer, it, None, 48)
    call = eng.prepare(s.context, s.question, **prepare_kwargs(s, "qgpm"))
    rel = sorted(call.relevance, key=lambda r: r.rank)
    top = []
    for r in rel[:10]:
        lab = "E" if any(e.strip() in r.text or r.text.strip() in e for e in s.evidence) else ("N" if "magic" in r.text else "-")
        top.append([r.rank, round(float(r.z), 3), lab, r.text[:90]])
    rec = dict(task=it.task, depth=it.depth, index=it.index, n_sent=len(rel), evidence=s.evidence, top=top,
               details={k: call.details.get(k) for k in ("flat_relevance", "decisive_relevance", "s_low")})
    out.write(json.dumps(rec) + "\n"); out.flush()
    print(it.task, it.depth, it.index, [(t[1], t[2]) for t in top[:6]], flush=True)
