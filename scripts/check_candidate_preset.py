# Does the SmolLM2 preset keep the plain ~400-token needle of tests/test_engine.py? (docs/tuning/smollm2_dev_4k.md)
# Compares the old 2K preset, the shipped preset, and the shipped preset without its short-context rule (keep_length=0).
# usage: python scripts/check_candidate_preset.py
import sys, time
sys.path.insert(0, 'tests')
from qgpm import QGPM
from test_engine import needle_context, QUESTION, NEEDLE
e = QGPM.from_pretrained()
old = e.config.with_(k_sharp=4.0, s_low=0.6, anchor_ratio=0.25, min_top_z=None, keep_length=0.0)
ctx = needle_context()
for name, cfg in (("old 2K preset", old), ("shipped preset", e.config), ("shipped, keep_length=0", e.config.with_(keep_length=0.0))):
    t = time.time(); r = e.answer(ctx, QUESTION, method="qgpm", max_new_tokens=32, config=cfg)
    print(name, repr(r.text), r.top_sentences(1)[0].text == NEEDLE, "flat:", r.details.get("flat_relevance"),
          "s_low':", r.details.get("s_low"), "top z:", round(r.top_sentences(1)[0].z, 2), round(time.time() - t, 1), "s")
