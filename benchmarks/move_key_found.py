"""Which key's value did each answer copy? Exact gold, the gold value truncated (>= 5 digits,
a dropped last digit), or another number; on the 18 dev MK-1 samples of the move stages
(docs/tuning/smollm2_dev_4k.md, "Moving instead of compressing" and "Reordering in place").

usage: python benchmarks/move_key_found.py
"""
import json,glob,re
def rows(pattern, method, cfg=None):
    out={}
    for f in glob.glob(pattern):
        for l in open(f):
            r=json.loads(l)
            if r['task']=='niah_multikey_1' and r['length']==4096 and r['method']==method and r['index']<6 and r['depth'] in (0.25,0.5,0.75):
                if cfg and not r['config_hash'].startswith(cfg): continue
                out[(r['depth'],r['index'])]=r
    return out
def key(r):
    g=r['gold'][0]; m=re.search(r'\d+', r['answer'].replace(',',''))
    if not m: return 'none'
    a=m.group(0)
    if a==g: return 'exact'
    if len(a)>=5 and g.startswith(a): return 'prefix'
    return 'other'
sets={'vanilla':rows('benchmarks/results/tune_smollm2_dev_4k/move/move_mk1/tune_rows.jsonl','vanilla'),
 'oracle compress c2 s0.3 (coarse)':rows('benchmarks/results/tune_smollm2_dev_4k/coarse/c2_s03*/tune_rows.jsonl','oracle'),
 'oracle move c2':rows('benchmarks/results/tune_smollm2_dev_4k/move/move_mk1/tune_rows.jsonl','oracle'),
 'oracle move all planes':rows('benchmarks/results/tune_smollm2_dev_4k/move/moveall_mk1/tune_rows.jsonl','oracle'),
 'qgpm move c2':rows('benchmarks/results/tune_smollm2_dev_4k/move/move_mk1/tune_rows.jsonl','qgpm'),
 'oracle reorder':rows('benchmarks/results/tune_smollm2_dev_4k/reorder/reorder_mk1/tune_rows.jsonl','oracle'),
 'qgpm reorder':rows('benchmarks/results/tune_smollm2_dev_4k/reorder/reorder_mk1/tune_rows.jsonl','qgpm')}
import collections
for n,s in sets.items():
    c=collections.Counter(key(r) for r in s.values()); print(f"{n:35s} n={len(s)} {dict(c)}")
