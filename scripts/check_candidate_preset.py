# Does a candidate preset keep the plain ~400-token needle of tests/test_engine.py? (docs/tuning/smollm2_dev_4k.md)
# usage: python scripts/check_candidate_preset.py
import sys, time
sys.path.insert(0, 'tests')
from qgpm import QGPM, QGPMConfig
from test_engine import needle_context, QUESTION, NEEDLE
e = QGPM.from_pretrained()
cand = e.config.with_(k_sharp=4.0, s_low=0.3, anchor_ratio=2.0, min_top_z=2.5)
ctx = needle_context()
for name, cfg in (("old", e.config), ("new", cand)):
    t = time.time(); r = e.answer(ctx, QUESTION, method="qgpm", max_new_tokens=32, config=cfg)
    print(name, repr(r.text), r.top_sentences(1)[0].text == NEEDLE, r.details.get("flat_relevance"), round(r.top_sentences(1)[0].z, 2), round(time.time()-t, 1))
ctx = needle_context(16, 5)
r = e.answer(ctx, QUESTION, method="qgpm", max_new_tokens=12, config=cand); print("stream-ctx", repr(r.text), r.details.get("flat_relevance"))
