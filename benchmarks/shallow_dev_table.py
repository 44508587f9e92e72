"""A cheaper pass 1 against the shipped one on the dev samples of the `shallow` stage
(scripts/tune_4k.sh), from the committed rows: the shallow head set (layers < 18; the
default stage) or, with ``--stage bf16``, pass 1 at bfloat16 (rows of 2026-12-03, the same
samples).

    python benchmarks/shallow_dev_table.py
    python benchmarks/shallow_dev_table.py --stage bf16

The shipped set's answers under the shipped preset: the nodecisive stage (single needle,
NoLiMa; a23b32), textorder60/rank (multi-value contents 6-11; dc58f6, where the dominance
rule fired on none), the term stage's multi-key rows (7cefc6) with the runon stage's two
changed samples (dc58f6). A multi-key sample where the dominance rule fired under 7cefc6 has
no shipped-preset answer and is left out (listed).
"""
import argparse
import collections
import glob
import json
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--stage", default="shallow", choices=["shallow", "bf16"], help="the stage folder under tune_smollm2_dev_4k")
args = ap.parse_args()
NAME = {"shallow": "shallow set", "bf16": "bfloat16 pass 1"}[args.stage]

R = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "tune_smollm2_dev_4k") + "/"
def load(f): return [json.loads(l) for l in open(f)]
ship={}
for f,h in [(R+'nodecisive/single/rows.jsonl','a23b32'),(R+'nodecisive/nolima/rows.jsonl','a23b32'),(R+'textorder60/rank/rows.jsonl','dc58f6'),(R+'term/term_mk1/tune_rows.jsonl','7cefc6'),(R+'runon/mk1/rows.jsonl','dc58f6')]:
    for r in load(f):
        if r['method']!='qgpm' or not r['config_hash'].startswith(h): continue
        k=(r['task'],r['depth'],r['index'])
        if 'runon' in f or k not in ship: ship[k]=r
sh={}
for f in glob.glob(R+args.stage+'/*/rows.jsonl'):
    for r in load(f):
        if r['method']=='qgpm': sh[(r['task'],r['depth'],r['index'])]=r
c=collections.defaultdict(lambda:[0,0,0,0,0,0])
excl=[]
for k,r in sh.items():
    s=ship.get(k)
    if s is None: excl.append((k,'no shipped row')); continue
    if s.get('decisive_relevance'): excl.append((k,'decisive fired under 7cefc6')); continue
    t=c[k[0]]; t[0]+=1; t[1]+=bool(r['correct']); t[2]+=bool(s['correct'])
    t[3]+=bool(r['correct']) and not s['correct']; t[4]+=bool(s['correct']) and not r['correct']; t[5]+=r['answer']==s['answer']
print(f'| task | pairs | {NAME} right | shipped set right | {args.stage} only / shipped only | same answer text |')
print('|---|---|---|---|---|---|')
T=[0]*6
for t in sorted(c):
    v=c[t]; T=[a+b for a,b in zip(T,v)]
    print(f'| {t} | {v[0]} | {v[1]} | {v[2]} | {v[3]}/{v[4]} | {v[5]} |')
print(f'| **all** | {T[0]} | {T[1]} | {T[2]} | {T[3]}/{T[4]} | {T[5]} |')
print('excluded',excl)
# evidence rank (0-based)
for name,d in ((args.stage,sh),('shipped',ship)):
    rr=[r.get('evidence_rank') for k,r in d.items() if k in sh and k in ship and r.get('evidence_rank') is not None]
    print(name,'evidence ranked first', sum(x==0 for x in rr),'of',len(rr), 'MRR', round(sum(1/(x+1) for x in rr)/len(rr),3))
