# The README table "What the bundled example shows": every bundled question with vanilla and qgpm
# (shipped preset, 40 new tokens), with the evidence depth and whether the expected answer is in the reply.
# usage: python scripts/bundled_examples.py [N ...]   (default: every bundled question)
#        METHODS=qgpm python scripts/bundled_examples.py   (only QGPM, e.g. after a preset change; vanilla does not change)
import os, sys, time, logging
logging.basicConfig(level=logging.WARNING)
from qgpm import QGPM
from qgpm.cli import sample_document
e = QGPM.from_pretrained()
text, qs = sample_document()
which = [int(a) for a in sys.argv[1:]] or range(len(qs))
for i in which:
    q = qs[i]
    depth = round(100 * text.find(q["evidence"]) / len(text))
    for m in os.environ.get("METHODS", "vanilla,qgpm").split(","):
        t = time.time(); r = e.answer(text, q["question"], method=m, max_new_tokens=40)
        extra = ""
        if m == "qgpm":
            top = r.top_sentences(3)
            extra = (f" s_low={r.details.get('s_low')} flat={r.details.get('flat_relevance')} decisive={r.details.get('decisive_relevance')}"
                     f" term_dropped={r.details.get('term_dropped')}"
                     f" top_z={[round(s.z, 2) for s in top]} ev_rank={[s.rank for s in r.relevance if q['evidence'][:40] in s.text]}")
        right = q["answer"].lower() in r.text.lower()
        print(i, f"{depth}%", m, "RIGHT" if right else "wrong", r.usage.prompt_tokens, repr(r.text[:120]), "| want", q["answer"],
              round(time.time() - t, 1), extra, flush=True)
