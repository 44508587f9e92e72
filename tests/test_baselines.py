"""The query-agnostic RoPE baselines (STRING, Ms-PoE, Self-Extend): rules, settings,
exactness against a brute-force softmax, identity with vanilla where the method is the
identity, a clean model after every call, and the public entry points."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import DynamicCache

from baseline_reference import BruteForce
from qgpm_testing import FAMILIES, tiny_model

from qgpm import METHODS, QGPM, MsPoEOptions, SelfExtendOptions, StringOptions
from qgpm.baselines import BASELINE_METHODS, BASELINE_OPTIONS, ROPE_BASELINES, options_from_strings, resolve_options, rules
from qgpm.baselines import attention as attn_mod
from qgpm.baselines.attention import ATTENTION_NAME, active_plans, attention_lse, merge_by_lse
from qgpm.runtime import apply_plan, decoder_layers

CONTEXT = " ".join(f"Line {i} mentions item {i % 6} and a colour." for i in range(8))
QUESTION = "Which item does line 3 mention?"
FORCED = [5, 17, 99, 3]  # teacher-forced decode tokens


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs the tiny model on one thread (see conftest.one_thread)."""


def run_steps(model, ids, plan, forced=FORCED):
    """Logits of a prefill and of one decode step per forced token, through the KV cache."""
    out = []
    with apply_plan(model, plan), torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out.append(model(input_ids=ids, cache=cache, use_cache=True).logits[0])
        for t in forced:
            out.append(model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True).logits[0])
    return out


def max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def clean(model, impl) -> bool:
    """No plan attached, the original attention implementation back, no hooks."""
    return (
        active_plans() == 0
        and model.config._attn_implementation == impl
        and all(not l._forward_pre_hooks and not l.self_attn._forward_pre_hooks for l in decoder_layers(model))
    )


def sharpen(model, seed: int = 1):
    """Scale each layer's query projection per head so that heads differ in how peaked their
    attention is (random tiny models attend almost uniformly: every Ms-PoE score would be 0)."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        for layer in decoder_layers(model):
            w = layer.self_attn.q_proj.weight
            for h in range(cfg.num_attention_heads):
                w[h * hd : (h + 1) * hd] *= float(torch.randint(1, 60, (1,), generator=g))
    return model


# ----------------------------------------------------------------------------- rules


def test_string_distance_rule():
    d = torch.tensor([0, 5, 19, 20, 21, 100])
    assert rules.string_distance(d, 20, 5).tolist() == [0, 5, 19, 5, 6, 85]


def test_self_extend_positions_and_continuity():
    i, j = torch.tensor([20]), torch.arange(21)
    d = rules.self_extend_distance(i, j, group_size=4, window=8)[0]
    # neighbour window: d = i - j for i - j < 8; beyond: floor(20/4) + 8 - 2 - floor(j/4)
    assert d[13:].tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    assert d[12].item() == 8  # continuity at the window edge
    assert d[0].item() == 11 and d[4].item() == 10
    assert bool((d[:-1] >= d[1:]).all())  # farther keys never look nearer
    assert rules.self_extend_positions(torch.tensor([7]), 3, 16, query=True).item() == pytest.approx(2 + 16 - 16 / 3)


def test_ms_poe_ratio_rules():
    assert rules.ms_poe_ratios(3, 1.2, 1.8).tolist() == pytest.approx([1.2, 1.5, 1.8])
    assert rules.ms_poe_ratios(1, 1.2, 1.8).tolist() == [1.2]
    table = rules.ms_poe_ratios(3, 1.2, 1.8)
    assert rules.ms_poe_unit_ratios(torch.tensor([0.1, 0.5, 0.3]), table).tolist() == pytest.approx([1.8, 1.2, 1.5])
    assert rules.ms_poe_unit_ratios(torch.zeros(3), table).tolist() == pytest.approx([1.2, 1.5, 1.8])  # ties: index order
    w = torch.full((1, 10), 0.0375)
    w[0, :2] = 0.35  # two of ten keys above 3 x the mean (0.1)
    assert rules.position_awareness_scores(w).tolist() == [0.2]
    assert rules.ms_poe_distance(torch.tensor([3.0]), 1.5).item() == pytest.approx(2.0)


def test_lse_merge_equals_one_softmax_over_the_union():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 5, 8), torch.randn(1, 2, 11, 8), torch.randn(1, 2, 11, 8)
    split = torch.zeros(5, 11, dtype=torch.bool)
    split[:, 4:] = True
    split[0] = False  # row 0 has no key in branch a: it weighs nothing there
    out_a, lse_a = attention_lse(q, k, v, split, 0.3)
    out_b, lse_b = attention_lse(q, k, v, ~split, 0.3)
    assert torch.isneginf(lse_a[..., 0]).all() and (out_a[..., 0, :] == 0).all()
    got, lse = merge_by_lse(out_a, lse_a, out_b, lse_b)
    logits = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) * 0.3
    ref = torch.softmax(logits, -1) @ v.unsqueeze(2)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=0, atol=1e-6)


def _softmax_sdpa(q, k, v, attn_mask=None, scale=None, enable_gqa=False):
    """Explicit masked softmax attention: a row with no allowed key comes out NaN, as in
    torch versions and kernels that do not zero such rows (torch 2.13 on CPU zeroes them)."""
    if enable_gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    logits = (q @ k.transpose(-1, -2)) * scale
    logits = logits.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


@pytest.mark.parametrize("per_row_shift", [False, True])
@pytest.mark.parametrize("sdpa", ["torch", "nan_rows"])
def test_row_with_no_allowed_key_gets_zero_and_other_rows_are_untouched(per_row_shift, sdpa, monkeypatch):
    """Only the model's own mask can leave a query row with no key (e.g. a padded row):
    that row's output is 0, not NaN, and masking it changes no other row; also under an
    attention kernel that returns NaN for such rows."""
    if sdpa == "nan_rows":
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", _softmax_sdpa)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    shift = torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0, 3.5]) if per_row_shift else torch.full((6,), 2.0)
    kw = dict(qpos=torch.arange(6), threshold=2, inv_freq=inv, scaling=0.35, query_shift=shift)
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))[None, None]
    mask = causal.clone()
    mask[..., 3, :] = False  # row 3 may attend to nothing
    full = attn_mod.two_branch_attention(q, k, v, causal, **kw)
    got = attn_mod.two_branch_attention(q, k, v, mask, **kw)
    assert torch.isfinite(got).all()
    assert (got[:, 3] == 0).all() and (full[:, 3] != 0).any()
    others = [0, 1, 2, 4, 5]
    torch.testing.assert_close(got[:, others], full[:, others], rtol=0, atol=0)
    torch.testing.assert_close(attn_mod.two_branch_attention(q, k, v, None, **kw), full, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: StringOptions(shift=0), "shift must be >= 1"),
        (lambda: StringOptions(shift=100, local_window=200), "exceeds shift"),
        (lambda: StringOptions(shift_ratio=0.0), "shift_ratio"),
        (lambda: StringOptions(local_window=-1), "local_window must be >= 0"),
        (lambda: StringOptions(local_window=12.5), "must be an int"),
        (lambda: StringOptions(cos_sin_scale=0), "cos_sin_scale must be positive"),
        (lambda: MsPoEOptions(min_ratio=0.5), "1 <= min_ratio <= max_ratio"),
        (lambda: MsPoEOptions(min_ratio=2.0, max_ratio=1.5), "1 <= min_ratio <= max_ratio"),
        (lambda: MsPoEOptions(skip_layers=-1), "skip_layers must be >= 0"),
        (lambda: SelfExtendOptions(group_size=0), "group_size must be >= 1"),
        (lambda: SelfExtendOptions(window=True), "must be an int"),
    ],
)
def test_bad_options_fail_at_construction(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_options_are_frozen_and_registered_in_one_place():
    opts = StringOptions()
    with pytest.raises(Exception):
        opts.local_window = 3  # type: ignore[misc]
    assert opts.with_(local_window=64).local_window == 64 and opts.local_window == 128
    assert StringOptions().shift_for(3000) == 1000 and StringOptions(shift=700).shift_for(3000) == 700
    assert tuple(BASELINE_OPTIONS) == BASELINE_METHODS == ("string", "ms-poe", "self-extend", "llmlingua-2")
    assert ROPE_BASELINES == ("string", "ms-poe", "self-extend")
    assert all(m in METHODS for m in BASELINE_METHODS)
    assert (SelfExtendOptions().group_size, SelfExtendOptions().window) == (8, 1024)
    assert (MsPoEOptions().min_ratio, MsPoEOptions().max_ratio, MsPoEOptions().skip_layers) == (1.2, 1.8, 2)


def test_resolve_and_parse_options():
    assert resolve_options("string", None) == StringOptions()
    assert resolve_options("self-extend", {"group_size": 4}) == SelfExtendOptions(group_size=4)
    assert resolve_options("vanilla", None) is None
    with pytest.raises(TypeError, match="takes options=StringOptions"):
        resolve_options("string", MsPoEOptions())
    with pytest.raises(ValueError, match="takes none"):
        resolve_options("qgpm", StringOptions())
    got = options_from_strings(["string.local_window=16", "string.shift=none", "self-extend.group_size=4", "ms-poe.max_ratio=2"])
    assert got == {"string": StringOptions(local_window=16), "self-extend": SelfExtendOptions(group_size=4), "ms-poe": MsPoEOptions(max_ratio=2.0)}
    for bad, match in [("string.local_window", "expected method.field=value"), ("magic.x=1", "not one of"),
                       ("string.windw=3", "has no field 'windw'"), ("ms-poe.min_ratio=0.2", "min_ratio")]:
        with pytest.raises(ValueError, match=match):
            options_from_strings([bad])


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)])


def test_bad_settings_fail_before_any_model_work(tiny, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("the model ran")

    monkeypatch.setattr(tiny.model, "forward", forbidden)
    with pytest.raises(TypeError, match="takes options=MsPoEOptions"):
        tiny.answer(CONTEXT, QUESTION, method="ms-poe", options=StringOptions())
    with pytest.raises(ValueError, match="takes none"):
        tiny.answer(CONTEXT, QUESTION, method="qgpm", options=StringOptions())
    with pytest.raises(ValueError, match="skip_layers=9 exceeds the model's 4 layers"):
        tiny.prepare(CONTEXT, QUESTION, method="ms-poe", options=MsPoEOptions(skip_layers=9))
    with pytest.raises(ValueError, match="unknown method"):
        tiny.answer(CONTEXT, QUESTION, method="strng")
    assert clean(tiny.model, "eager")


# ----------------------------------------------------------------------------- exactness


CASES = [
    ("string", StringOptions(shift=20, local_window=5), dict(shift=20, local_window=5)),
    ("string", StringOptions(shift=33, local_window=0, cos_sin_scale=1.07), dict(shift=33, local_window=0, logit_scale=1.07**2)),
    ("self-extend", SelfExtendOptions(group_size=3, window=16), dict(group_size=3, window=16)),
    ("ms-poe", MsPoEOptions(skip_layers=1), dict(min_ratio=1.2, max_ratio=1.8, skip_layers=1)),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_merge_equals_brute_force_softmax(family, tokenizer, monkeypatch):
    """Prefill and decode steps equal a masked softmax over the remapped distance matrix,
    computed in float64 from un-rotated queries and keys (tests/baseline_reference.py).
    Small query blocks make the prefill run through several blocks."""
    monkeypatch.setattr(attn_mod, "_BLOCK_ELEMENTS", 4 * 120 * 7)
    model = sharpen(tiny_model(family, len(tokenizer)))
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    for method, opts, settings in CASES:
        call = engine.prepare(CONTEXT, QUESTION, method=method, options=opts)
        n = call.num_tokens
        assert n > 2 * 33
        ref = run_steps(model, call.input_ids, BruteForce(method, call.plan.rotary.inv_freq, n, **settings))
        got = run_steps(model, call.input_ids, call.plan)
        vanilla = run_steps(model, call.input_ids, None)
        assert max_diff(got, ref) < 2e-5, (method, max_diff(got, ref))
        assert max_diff(got, vanilla) > 1e-3, method  # the remapping is live
        assert clean(model, "eager")


def test_ms_poe_orders_kv_groups_by_score(tokenizer):
    """Under GQA one ratio per KV group; the group with the most outliers gets the smallest ratio."""
    model = sharpen(tiny_model("qwen2", len(tokenizer), num_attention_heads=8, num_key_value_heads=4), seed=3)
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    call = engine.prepare(CONTEXT, QUESTION, method="ms-poe", options=MsPoEOptions(skip_layers=0))
    bf = BruteForce("ms-poe", call.plan.rotary.inv_freq, call.num_tokens, min_ratio=1.2, max_ratio=1.8, skip_layers=0)
    got, ref = run_steps(model, call.input_ids, call.plan), run_steps(model, call.input_ids, bf)
    assert max_diff(got, ref) < 2e-5
    orders = []
    for layer, r in call.plan.ratios.items():
        assert r.shape == (1, 4)
        assert sorted(r[0].tolist()) == pytest.approx([1.2, 1.4, 1.6, 1.8])
        torch.testing.assert_close(r[0], bf.ratios[layer])
        orders.append(tuple(r[0].tolist()))
    assert len(set(orders)) > 1  # layers order their groups differently: the score decides


def fractional_steps(model, ids, ratio: float, forced=FORCED):
    """What Ms-PoE with one ratio for every head means, computed by the model's own rotary:
    the prompt and each forced decode token at position ``p / ratio`` (no qgpm code involved)."""
    out, n = [], ids.shape[1]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out.append(model(input_ids=ids, position_ids=(torch.arange(n, dtype=torch.float32) / ratio)[None], cache=cache, use_cache=True).logits[0])
        for i, t in enumerate(forced):
            pos = torch.tensor([[(n + i) / ratio]])
            out.append(model(input_ids=torch.tensor([[t]]), position_ids=pos, cache=cache, use_cache=True).logits[0])
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_uniform_ms_poe_equals_fractional_position_ids(family, impl, tokenizer):
    """Ms-PoE with min_ratio = max_ratio = r on every layer is the model read at positions p / r:
    an independent reference through transformers' rotary, prefill and cached decode steps."""
    model = tiny_model(family, len(tokenizer), attn_implementation=impl)
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    ids = engine.prepare(CONTEXT, QUESTION, method="vanilla").input_ids
    vanilla = run_steps(model, ids, None)
    for r in (1.5, 1.8):
        call = engine.prepare(CONTEXT, QUESTION, method="ms-poe", options=MsPoEOptions(min_ratio=r, max_ratio=r, skip_layers=0))
        got = run_steps(model, ids, call.plan)
        assert max_diff(got, fractional_steps(model, ids, r)) < 2e-6, (family, impl, r)
        assert max_diff(got, vanilla) > 1e-3  # the positions did change
        assert clean(model, impl)


def test_sdpa_model_matches_brute_force_too(tokenizer):
    model = sharpen(tiny_model("qwen3", len(tokenizer), attn_implementation="sdpa"))
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    for method, opts, settings in CASES:
        call = engine.prepare(CONTEXT, QUESTION, method=method, options=opts)
        ref = run_steps(model, call.input_ids, BruteForce(method, call.plan.rotary.inv_freq, call.num_tokens, **settings))
        assert max_diff(run_steps(model, call.input_ids, call.plan), ref) < 2e-5, method
        assert clean(model, "sdpa")


# ----------------------------------------------------------------------------- identity with vanilla


def identity_cases(n: int, steps: int):
    """Settings under which each method is the identity for a prompt of ``n`` tokens plus
    ``steps`` generated ones; ``math`` marks those that still run the two-branch merge."""
    return [
        ("string", StringOptions(shift=n + steps, local_window=8), False),  # no distance reaches S
        ("string", StringOptions(shift=12, local_window=12), True),  # d - S + W = d, through both branches
        ("self-extend", SelfExtendOptions(window=n + steps), False),  # every pair in the neighbour window
        ("self-extend", SelfExtendOptions(group_size=1, window=10), True),  # G = 1: grouped = standard positions
        ("ms-poe", MsPoEOptions(min_ratio=1.0, max_ratio=1.0, skip_layers=0), False),  # all ratios 1
    ]


def greedy(model, ids, steps, plan=None):
    with apply_plan(model, plan), torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_identity_settings_equal_vanilla_tiny_families(family, tokenizer):
    model = tiny_model(family, len(tokenizer))
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    ids = engine.prepare(CONTEXT, QUESTION, method="vanilla").input_ids
    n, steps = ids.shape[1], 5
    seq_ref, logits_ref = greedy(model, ids, steps)
    for method, opts, _math in identity_cases(n, steps):
        call = engine.prepare(CONTEXT, QUESTION, method=method, options=opts)
        seq, logits = greedy(model, ids, steps, call.plan)
        assert torch.equal(seq, seq_ref), (method, opts)
        torch.testing.assert_close(logits, logits_ref, rtol=0, atol=1e-5, msg=f"{method} {opts}")
        assert clean(model, "eager")
    # S = N exactly: the prompt itself is untouched (decoding then reaches S)
    call = engine.prepare(CONTEXT, QUESTION, method="string", options=StringOptions(shift=n, local_window=8))
    torch.testing.assert_close(run_steps(model, ids, call.plan, [])[0], run_steps(model, ids, None, [])[0], rtol=0, atol=1e-5)


def test_identity_settings_equal_vanilla_sdpa(tokenizer):
    model = tiny_model("llama", len(tokenizer), attn_implementation="sdpa")
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    ids = engine.prepare(CONTEXT, QUESTION, method="vanilla").input_ids
    ref = run_steps(model, ids, None)
    for method, opts, _math in identity_cases(ids.shape[1], len(FORCED)):
        call = engine.prepare(CONTEXT, QUESTION, method=method, options=opts)
        assert max_diff(run_steps(model, ids, call.plan), ref) < 1e-5, (method, opts)
        assert clean(model, "sdpa")


def test_short_prompt_string_warns_and_runs_standard_positions(tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        call = tiny.prepare(CONTEXT, QUESTION, method="string")  # S = N/3 < W = 128
    assert call.plan is None and call.details["remapped"] is False
    assert "standard positions" in caplog.text and "S = 0.333 * N" in caplog.text


# ----------------------------------------------------------------------------- clean model


class Boom(Exception):
    pass


@pytest.mark.parametrize("method", ROPE_BASELINES)
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_model_is_clean_after_a_call_and_after_a_fault(method, impl, tokenizer):
    from transformers import StoppingCriteria, StoppingCriteriaList

    model = tiny_model("llama", len(tokenizer), attn_implementation=impl)
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    opts = {"string": StringOptions(shift=20, local_window=4), "self-extend": SelfExtendOptions(group_size=2, window=20),
            "ms-poe": MsPoEOptions()}[method]
    ids = engine.prepare(CONTEXT, QUESTION, method="vanilla").input_ids
    with torch.inference_mode():
        before = model(ids).logits
    res = engine.answer(CONTEXT, QUESTION, method=method, options=opts, max_new_tokens=3)
    assert res.method == method and res.usage.answer_tokens > 0 and not res.relevance
    assert "query-agnostic" in res.explain()
    assert clean(model, impl)

    class RaiseAtStep2(StoppingCriteria):
        calls = 0

        def __call__(self, input_ids, scores, **kw):
            self.calls += 1
            if self.calls == 2:
                raise Boom("injected")
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    with pytest.raises(Boom):
        engine.answer(CONTEXT, QUESTION, method=method, options=opts, max_new_tokens=6, stopping_criteria=StoppingCriteriaList([RaiseAtStep2()]))
    assert clean(model, impl)
    stream = engine.stream(CONTEXT, QUESTION, method=method, options=opts, max_new_tokens=6,
                           stopping_criteria=StoppingCriteriaList([RaiseAtStep2()]))
    with pytest.raises(Boom):
        list(stream)
    assert clean(model, impl)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


def test_stray_use_of_the_attention_name_is_a_clear_error(tokenizer):
    from qgpm.baselines.attention import register_attention

    register_attention()
    model = tiny_model("llama", len(tokenizer))
    model.set_attn_implementation(ATTENTION_NAME)
    with pytest.raises(RuntimeError, match="only valid inside a qgpm call"):
        model(torch.tensor([[1, 2, 3]]))


def test_prepare_generate_prepared_and_stream_agree(tiny):
    opts = SelfExtendOptions(group_size=2, window=24)
    call = tiny.prepare(CONTEXT, QUESTION, method="self-extend", options=opts)
    assert call.plan is not None and call.details == {"group_size": 2, "window": 24}
    a = tiny.generate_prepared(call, max_new_tokens=5, score=" item 3")
    b = tiny.answer(CONTEXT, QUESTION, method="self-extend", options=opts, max_new_tokens=5)
    stream = tiny.stream(CONTEXT, QUESTION, method="self-extend", options=opts, max_new_tokens=5)
    assert "".join(stream) == a.text == b.text == stream.result.text
    lp = tiny.answer_logprob(CONTEXT, QUESTION, " item 3", method="self-extend", options=opts)
    assert a.details["score_logprob"] == pytest.approx(lp, abs=1e-3)
    assert clean(tiny.model, "eager")


def test_unsupported_family_is_named_for_baselines(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    from qgpm import UnsupportedModelError

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2)).eval()
    engine = QGPM(model, tokenizer, heads=[(0, 0)])
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        engine.answer(CONTEXT, QUESTION, method="string", max_new_tokens=2)


@pytest.mark.parametrize("method", ["string", "self-extend", "ms-poe"])
def test_rope_baselines_refuse_models_with_several_rotary_kinds(method, tokenizer):
    """Gemma 3 is supported by qgpm/oracle, but the RoPE baselines re-rotate every layer with one
    inv_freq: they must refuse it, naming the layer kinds, not rotate local layers with global frequencies."""
    from qgpm import UnsupportedModelError

    engine = QGPM(tiny_model("gemma3_text", len(tokenizer)), tokenizer, heads=[(1, 0)])
    with pytest.raises(UnsupportedModelError, match="full_attention, sliding_attention"):
        engine.answer(CONTEXT, QUESTION, method=method, max_new_tokens=2)
    assert engine.prepare(CONTEXT, QUESTION, method="qgpm").plan is not None  # qgpm itself works


@pytest.mark.parametrize("method", ["string", "self-extend", "ms-poe"])
def test_rope_baselines_refuse_a_prompt_past_the_sliding_window_before_any_forward(method, tokenizer):
    """Mistral's sliding window: the baselines recompute attention over the whole key cache, which
    a sliding layer's cache stops holding past its window. Refused before the prefill, naming
    the window; a prompt that fits the window with its answer still runs."""
    from qgpm import UnsupportedModelError
    from qgpm.runtime import decoder_layers

    model = tiny_model("mistral", len(tokenizer), attn_implementation="sdpa", sliding_window=64)
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    forwards = []
    handle = decoder_layers(model)[0].register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(UnsupportedModelError, match="sliding window of 64 tokens"):
            engine.answer(CONTEXT, QUESTION, method=method, max_new_tokens=2)
        assert forwards == []
        short = engine.answer("The vault code is 4417.", "What is the code?", method=method, max_new_tokens=2,
                              options=StringOptions(shift=8, local_window=4) if method == "string" else None)
        assert short.usage.prompt_tokens + 2 <= 64 and forwards
    finally:
        handle.remove()


# ----------------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_identity_settings_equal_vanilla_real_smollm2(smollm):
    ctx = CONTEXT + " " + " ".join(f"Note {i}: the harbour ledger lists crate {i * 7}." for i in range(10))
    ids = smollm.prepare(ctx, QUESTION, method="vanilla").input_ids
    n, steps = ids.shape[1], 3
    assert 150 < n < 400
    seq_ref, logits_ref = greedy(smollm.model, ids, steps)
    for method, opts, _math in identity_cases(n, steps):
        call = smollm.prepare(ctx, QUESTION, method=method, options=opts)
        seq, logits = greedy(smollm.model, ids, steps, call.plan)
        assert torch.equal(seq, seq_ref), (method, opts)
        torch.testing.assert_close(logits, logits_ref, rtol=0, atol=2e-4, msg=f"{method} {opts}")
    impl = smollm.model.config._attn_implementation
    # default Ms-PoE on the real model: scores are not all tied, the call leaves the model clean
    call = smollm.prepare(ctx, QUESTION, method="ms-poe")
    res = smollm.generate_prepared(call, max_new_tokens=4)
    assert res.usage.answer_tokens > 0 and len(call.plan.ratios) == 30 - 2
    assert any(len(set(r[0].tolist())) == 3 for r in call.plan.ratios.values())
    assert clean(smollm.model, impl)
