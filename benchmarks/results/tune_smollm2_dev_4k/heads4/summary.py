import json, sys, collections
rows = {}
for p in sys.argv[1:]:
    for l in open(p):
        r = json.loads(l); rows[(r["task"], r["depth"], r["index"], r["max_heads"])] = r
g = collections.defaultdict(list)
for (t, d, i, h), r in sorted(rows.items(), key=lambda kv: str(kv[0])):
    g[(t, h)].append(r)
for (t, h), rs in sorted(g.items(), key=lambda kv: str(kv[0])):
    tz = [r["top_z"][0] for r in rs]; gap = [r["top_z"][0] - r["top_z"][1] for r in rs]
    first = sum(1 for r in rs if r["evidence_ranks"][:1] == [0])
    print(f"{t:18s} heads={str(h):4s} n={len(rs):2d} ev-first={first:2d} topz {min(tz):.2f}-{max(tz):.2f} gap {min(gap):.2f}-{max(gap):.2f}")
    if "-v" in sys.argv[0:1] or True:
        print("    ", " ".join(f"{r['depth']}/{r['index']}:{r['top_z'][0]:.2f},{r['top_z'][0]-r['top_z'][1]:.2f},{r['evidence_ranks'][:2]}" for r in rs))
