# dev-split pass-1 check: where the heads rank the queried key in the
# three new essay multi-key misses of the preset in the solo stage (12 contents x 3 depths).
#   python rank_misses.py
import torch
torch.set_num_threads(1)
from qgpm.eval.answering import prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.eval.work import make_sample, work_items
eng = load_engine("smollm2", device="cpu", dtype="float32")
want = {(0.25, 5), (0.25, 10), (0.5, 7)}
for it in work_items(["niah_multikey_1"], [4096], [0.25, 0.5, 0.75], 12, "dev"):
    if (it.depth, it.index) not in want: continue
    s = make_sample(eng.tokenizer, it, None, 48)
    call = eng.prepare(s.context, s.question, **prepare_kwargs(s, "qgpm"))
    rel = sorted(call.relevance, key=lambda r: r.rank)
    print(it.depth, it.index, [(r.rank, round(float(r.z), 2), r.text[-24:]) for r in rel[:3]], s.evidence, flush=True)
