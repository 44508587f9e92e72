"""Brute-force reference of the RoPE baselines, for the exactness tests.

Independent of :mod:`qgpm.baselines.attention`: every query and key is rotated back to
position 0 (float64), the method's distance matrix ``D`` comes from
:mod:`qgpm.baselines.rules`, each logit is ``<R(D_ij) q_i, k_j>`` (RoPE logits depend on
relative position only) and the causal softmax is taken over the whole row at once.
"""

from __future__ import annotations

import torch

from qgpm.baselines import rules


def _rot(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [..., T, d] rotated by angle pos[..., T] * w (rotate-half layout), float64."""
    ang = pos.to(torch.float64).unsqueeze(-1) * inv_freq.to(torch.float64)
    cos, sin = ang.cos(), ang.sin()
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class BruteForce:
    """A stand-in plan: ``attention`` computes the method from its distance matrix."""

    def __init__(self, method: str, inv_freq: torch.Tensor, n_tokens: int, **settings) -> None:
        self.method, self.inv_freq, self.n_tokens, self.s = method, inv_freq.to(torch.float64), n_tokens, settings
        self.ratios: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        self.ratios = {}

    def _ms_poe_ratios(self, layer, q_raw, k_raw, scaling):
        if layer not in self.ratios:  # outlier share of the last prompt row, one score per KV group
            n = self.n_tokens
            n_kv = k_raw.shape[1]
            rep = q_raw.shape[1] // n_kv
            logits = torch.einsum("hd,hkd->hk", q_raw[0, :, n - 1], k_raw[0].repeat_interleave(rep, 0)[:, :n]) * scaling
            w = torch.softmax(logits, -1)
            share = (w > 3.0 / n).double().mean(-1).view(n_kv, rep).mean(-1)
            table = torch.linspace(self.s["min_ratio"], self.s["max_ratio"], n_kv, dtype=torch.float64) if n_kv > 1 else torch.tensor([self.s["min_ratio"]], dtype=torch.float64)
            order = sorted(range(n_kv), key=lambda g: (-float(share[g]), g))
            r = torch.empty(n_kv, dtype=torch.float64)
            for rank, g in enumerate(order):
                r[g] = table[rank]
            self.ratios[layer] = r
        return self.ratios[layer]

    def attention(self, module, layer, query, key, value, mask, scaling, dropout, kwargs):
        b, h, q_len, d = query.shape
        n_kv, k_len = key.shape[1], key.shape[2]
        rep = h // n_kv
        i = torch.arange(k_len - q_len, k_len)
        j = torch.arange(k_len)
        q_raw = _rot(query.double(), -i.double(), self.inv_freq)
        k_raw = _rot(key.double(), -j.double(), self.inv_freq)
        dist = (i[:, None] - j[None, :]).double()  # [q, K]
        m, s = self.method, self.s
        if m == "string":
            D = rules.string_distance(dist, s["shift"], s["local_window"])[None].expand(h, -1, -1)
            scaling = scaling * s.get("logit_scale", 1.0)
        elif m == "self-extend":
            D = rules.self_extend_distance(i, j, s["group_size"], s["window"])[None].expand(h, -1, -1)
        elif m == "ms-poe":
            if layer < s["skip_layers"]:
                D = dist[None].expand(h, -1, -1)
            else:
                r = self._ms_poe_ratios(layer, q_raw, k_raw, scaling).repeat_interleave(rep)
                D = torch.stack([rules.ms_poe_distance(dist, float(r[x])) for x in range(h)])
        else:
            raise ValueError(m)
        kk = k_raw.repeat_interleave(rep, 1)  # [B, H, K, d]
        vv = value.double().repeat_interleave(rep, 1)
        # logits[b, h, a, j] = <R(D[h, a, j]) q_raw[b, h, a], k_raw[b, h, j]>
        qr = _rot(q_raw.unsqueeze(3).expand(-1, -1, -1, k_len, -1), D.unsqueeze(0), self.inv_freq)  # [B, H, q, K, d]
        logits = (qr * kk.unsqueeze(2)).sum(-1) * scaling
        logits = logits.masked_fill(dist[None, None] < 0, float("-inf"))
        out = torch.softmax(logits, -1) @ vv
        return out.transpose(1, 2).to(query.dtype).contiguous()

    def installed(self, model):
        from qgpm.baselines.attention import installed

        return installed(model, self)
