"""Pass 1 against brute-force references from full attention, and its early stop."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from qgpm import QGPM
from qgpm.relevance import Pass1Stats, head_token_logits, sentence_logits
from qgpm.runtime import decoder_layers
from qgpm.shaping import fuse_heads

from qgpm_testing import tiny_model

CONTEXT = " ".join(f"Line {i} mentions the number {i * 37 % 101} in passing." for i in range(20)) + " The vault code is 4417."
QUESTION = "What is the vault code?"
HEADS = [(1, 0), (1, 3), (2, 1), (3, 2)]


def full_logits_reference(model, ids, own_scale=False):
    """Per layer: the full [heads, N, N] pre-softmax logits, from transformers' own RoPE code.

    Scaled by 1/sqrt(d), or with ``own_scale`` by the attention module's own ``scaling``
    (Gemma 3: ``query_pre_attn_scalar ** -0.5``)."""
    mod = importlib.import_module(type(model).__module__)
    captured = {}

    def make(li):
        def hook(module, args, kwargs):
            captured[li] = (kwargs["hidden_states"], kwargs["position_embeddings"])
        return hook

    layers = decoder_layers(model)
    hs = [l.self_attn.register_forward_pre_hook(make(i), with_kwargs=True) for i, l in enumerate(layers)]
    try:
        with torch.inference_mode():
            model(ids)
    finally:
        for h in hs:
            h.remove()
    cfg = model.config
    out = {}
    torch.set_grad_enabled(False)
    for li, (x, (cos, sin)) in captured.items():
        attn = layers[li].self_attn
        shape = (*x.shape[:-1], -1, attn.head_dim)
        q = attn.q_proj(x).view(shape)
        k = attn.k_proj(x).view(shape)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = mod.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        k = mod.repeat_kv(k, cfg.num_attention_heads // cfg.num_key_value_heads)
        scale = attn.scaling if own_scale else 1 / math.sqrt(attn.head_dim)
        out[li] = (q @ k.transpose(2, 3))[0] * scale  # [H, N, N]
    torch.set_grad_enabled(True)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3", "granite"])
def test_pass1_equals_full_logit_reference(family, tokenizer):
    model = tiny_model(family, len(tokenizer))
    engine = QGPM(model, tokenizer, heads=HEADS)
    call = engine.prepare(CONTEXT, QUESTION, method="vanilla")
    prompt = call.prompt
    got = head_token_logits(model, prompt.input_ids, HEADS, prompt.query_rows)
    ref_all = full_logits_reference(model, prompt.input_ids)
    rows = prompt.query_rows
    ref = torch.stack([ref_all[l][h][rows].amax(dim=0) for l, h in HEADS])
    torch.testing.assert_close(got, ref.float(), rtol=1e-4, atol=1e-4)


def test_pass1_equals_full_logit_reference_gemma3_both_layer_kinds(tokenizer):
    """Gemma 3: heads on global (1, 3) and sliding-window (2) layers, each read with its own
    layer kind's RoPE, after q/k-norm, scaled by query_pre_attn_scalar ** -0.5 (not 1/sqrt(d))."""
    model = tiny_model("gemma3_text", len(tokenizer))
    kinds = model.config.layer_types
    assert {kinds[l] for l, _ in HEADS} == {"sliding_attention", "full_attention"}
    assert model.config.query_pre_attn_scalar != model.config.head_dim
    engine = QGPM(model, tokenizer, heads=HEADS)
    prompt = engine.prepare(CONTEXT, QUESTION, method="vanilla").prompt
    assert prompt.input_ids.shape[1] > model.config.sliding_window
    got = head_token_logits(model, prompt.input_ids, HEADS, prompt.query_rows)
    ref_all = full_logits_reference(model, prompt.input_ids, own_scale=True)
    rows = prompt.query_rows
    ref = torch.stack([ref_all[l][h][rows].amax(dim=0) for l, h in HEADS])
    torch.testing.assert_close(got, ref.float(), rtol=1e-4, atol=1e-4)


def test_single_row_zscores_match_eager_attention_probabilities(tokenizer):
    """With one query row, log softmax = logits - const, so z-scores must agree exactly."""
    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, heads=HEADS)
    prompt = engine.prepare(CONTEXT, QUESTION, method="vanilla").prompt
    last = torch.tensor([prompt.num_tokens - 1])
    ours = head_token_logits(model, prompt.input_ids, HEADS, last)
    with torch.inference_mode():
        att = model(prompt.input_ids, output_attentions=True).attentions
    logp = torch.stack([att[l][0, h, -1].clamp_min(1e-30).log() for l, h in HEADS])
    n = len(prompt.sentences)
    z_ours = fuse_heads(sentence_logits(ours, prompt.token_sentence, n, prompt.newline_tokens))
    z_ref = fuse_heads(sentence_logits(logp, prompt.token_sentence, n, prompt.newline_tokens))
    torch.testing.assert_close(z_ours, z_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("heads,deepest", [([(0, 1)], 0), ([(2, 0), (1, 1)], 2), ([(3, 3)], 3)])
def test_pass1_stops_after_deepest_selected_layer(heads, deepest, tokenizer):
    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, heads=heads)
    prompt = engine.prepare(CONTEXT, QUESTION, method="vanilla").prompt
    stats = Pass1Stats()
    seen_mlp = []
    hooks = [l.mlp.register_forward_hook(lambda m, a, o, i=i: seen_mlp.append(i)) for i, l in enumerate(decoder_layers(model))]
    try:
        head_token_logits(model, prompt.input_ids, heads, prompt.query_rows, stats=stats)
    finally:
        for h in hooks:
            h.remove()
    assert stats.layers_run == list(range(deepest + 1))
    assert seen_mlp == list(range(deepest))  # the deepest layer stops after its q/k projections
    for layer in decoder_layers(model):
        assert not layer._forward_pre_hooks and not layer.self_attn._forward_pre_hooks


def test_newline_tokens_are_excluded(tokenizer):
    logits = torch.tensor([[5.0, 1.0, 9.0, 2.0]])
    ts = torch.tensor([0, 0, 1, 1])
    excl = torch.tensor([False, False, True, False])
    assert sentence_logits(logits, ts, 2, excl).tolist() == [[5.0, 2.0]]
    assert sentence_logits(logits, ts, 2, None).tolist() == [[5.0, 9.0]]
