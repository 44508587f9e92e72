"""Exactness against vanilla: with every score 1 the patched model is the unmodified model."""

from __future__ import annotations

import pytest
import torch

from qgpm import QGPM, QGPMConfig
from qgpm.runtime import apply_plan, decoder_layers

from qgpm_testing import FAMILIES, LAYERED_FAMILIES, tiny_model

IDENTITY = QGPMConfig(s_low=1.0)
STRONG = QGPMConfig(s_low=0.05, eps=0.05)
CONTEXT = " ".join(
    f"Sentence number {i} talks about topic {i % 7} and a few other things." for i in range(25)
) + " The secret code of the vault is 4417. " + " ".join(f"Filler line {i} is here." for i in range(20))
QUESTION = "What is the secret code of the vault?"


def greedy_logits(model, ids, steps, plan=None):
    with apply_plan(model, plan), torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
            output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        )
    return out.sequences, torch.stack(out.logits)


def prefill_logits(model, ids, plan=None):
    with apply_plan(model, plan), torch.inference_mode():
        return model(ids).logits


def _layer_input(model, ids, index, plan=None):
    """The hidden states entering decoder layer ``index`` in one prefill (with ``plan`` if
    given), and the prefill's logits."""
    seen = {}

    def grab(module, args, kwargs):
        seen.setdefault("h", (args[0] if args else kwargs["hidden_states"]).clone())

    handle = decoder_layers(model)[index].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        logits = prefill_logits(model, ids, plan)
    finally:
        handle.remove()
    return seen["h"], logits


@pytest.mark.parametrize("family", FAMILIES)
def test_identity_tiny_family(family, tokenizer):
    model = tiny_model(family, len(tokenizer))
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 3)], config=IDENTITY)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    assert ids.shape[1] > 250
    ref = prefill_logits(model, ids)
    got = prefill_logits(model, ids, call.plan)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    seq_ref, steps_ref = greedy_logits(model, ids, 6)
    seq_got, steps_got = greedy_logits(model, ids, 6, call.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-5)
    # The same plan machinery with real modulation must change the logits (the hooks are live).
    strong = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=STRONG)
    assert (prefill_logits(model, ids, strong.plan) - ref).abs().max() > 1e-4  # 10x the identity tolerance
    for layer in decoder_layers(model):  # nothing left behind
        assert not layer._forward_pre_hooks


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", LAYERED_FAMILIES)
def test_identity_tiny_gemma3_local_and_global_layers(family, attn, tokenizer):
    """Gemma 3: sliding-window (local, base 1e4) and global (base 1e6, linear scaling) layers,
    GQA, q/k-norm, a window far shorter than the prompt. Every score 1 is vanilla in prefill and
    decode; only global layers are hooked, each with its own kind's tables."""
    model = tiny_model(family, len(tokenizer), attn_implementation=attn)
    kinds = model.config.layer_types
    assert set(kinds) == {"sliding_attention", "full_attention"}
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 3)], config=IDENTITY)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    assert ids.shape[1] > 8 * model.config.sliding_window
    plan = call.plan
    assert [m is None for m in plan.layer_map] == [k == "sliding_attention" for k in kinds]
    assert sorted({m for m in plan.layer_map if m is not None}) == [0, 1]  # broad and sharp of the global kind
    rot = model.model.rotary_emb
    for table_rotary in plan.table_rotary:
        assert torch.equal(table_rotary.inv_freq, rot.full_attention_inv_freq.float())
    assert not torch.equal(rot.full_attention_inv_freq, rot.sliding_attention_inv_freq)
    ref = prefill_logits(model, ids)
    got = prefill_logits(model, ids, plan)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    seq_ref, steps_ref = greedy_logits(model, ids, 6)
    seq_got, steps_got = greedy_logits(model, ids, 6, plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-5)
    strong = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=STRONG)
    assert [m is None for m in strong.plan.layer_map] == [k == "sliding_attention" for k in kinds]
    assert (prefill_logits(model, ids, strong.plan) - ref).abs().max() > 1e-4  # the global hooks are live
    h_ref, _ = _layer_input(model, ids, 1)
    h_got, _ = _layer_input(model, ids, 1, strong.plan)
    torch.testing.assert_close(h_got, h_ref, rtol=0, atol=0)  # local layer 0 kept standard positions
    for layer in decoder_layers(model):  # nothing left behind
        assert not layer._forward_pre_hooks


@pytest.mark.parametrize("family", LAYERED_FAMILIES)
def test_gemma3_local_layers_modulated_on_request_and_identity_still_vanilla(family, tokenizer):
    """local_layers="modulated": the sliding-window layers get tables of their own kind (base
    1e4) and a live remap; with every score 1 the model is still exactly vanilla. A one-kind
    model refuses the setting before pass 1; reorder cannot keep local layers vanilla."""
    model = tiny_model(family, len(tokenizer), attn_implementation="sdpa")
    kinds = model.config.layer_types
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 3)], config=IDENTITY.with_(local_layers="modulated"))
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    assert None not in call.plan.layer_map
    rot = model.model.rotary_emb
    local_tables = {i for i, k in enumerate(kinds) if k == "sliding_attention" for i in [call.plan.layer_map[i]]}
    assert local_tables and all(torch.equal(call.plan.table_rotary[t].inv_freq, rot.sliding_attention_inv_freq.float()) for t in local_tables)
    ref = prefill_logits(model, ids)
    torch.testing.assert_close(prefill_logits(model, ids, call.plan), ref, rtol=0, atol=1e-5)
    seq_ref, steps_ref = greedy_logits(model, ids, 4)
    seq_got, steps_got = greedy_logits(model, ids, 4, call.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-5)
    # with a real remap the first (local) layer's output changes; with the default it does not
    strong = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=STRONG.with_(local_layers="modulated"))
    default = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=STRONG)
    h_ref, _ = _layer_input(model, ids, 1)
    h_mod, _ = _layer_input(model, ids, 1, strong.plan)
    h_def, _ = _layer_input(model, ids, 1, default.plan)
    assert kinds[0] == "sliding_attention"
    assert (h_mod - h_ref).abs().max() > 1e-4 and torch.equal(h_def, h_ref)
    # the global layers get the same tables either way
    g = kinds.index("full_attention")
    assert torch.equal(strong.plan.positions[strong.plan.layer_map[g]], default.plan.positions[default.plan.layer_map[g]])
    with pytest.raises(ValueError, match="remap='reorder'"):
        QGPMConfig(remap="reorder", local_layers="vanilla")
    with pytest.raises(ValueError, match="local_layers must be"):
        QGPMConfig(local_layers="sliding")
    llama = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)], config=STRONG.with_(local_layers="vanilla"))
    calls = []
    handle = decoder_layers(llama.model)[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="one rotary kind"):
            llama.prepare(CONTEXT, QUESTION, method="qgpm")
    finally:
        handle.remove()
    assert calls == []  # refused before pass 1


def test_identity_scaled_rope_llama3(tokenizer):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    model = tiny_model("llama", len(tokenizer), rope_parameters=rope)
    engine = QGPM(model, tokenizer, heads=[(1, 0)], config=IDENTITY)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ref = prefill_logits(model, call.prompt.input_ids)
    torch.testing.assert_close(prefill_logits(model, call.prompt.input_ids, call.plan), ref, rtol=0, atol=1e-5)


def test_identity_yarn_with_attention_scaling_and_its_longer_window(tokenizer):
    """Qwen2.5's long-context recipe: YaRN with max_position_embeddings left at the original
    window. The identity plan reproduces the model (YaRN's frequencies and its attention
    scaling, 1.1386 here), and the window QGPM checks is factor x original, not the config's
    max_position_embeddings, so a prompt the model runs is not refused as too long."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}
    model = tiny_model("qwen2", len(tokenizer), max_position_embeddings=256, rope_parameters=rope)
    assert abs(model.model.rotary_emb.attention_scaling - 1.1386) < 1e-3
    engine = QGPM(model, tokenizer, heads=[(1, 0)], config=IDENTITY)
    assert engine.max_length == 1024
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    assert 256 < ids.shape[1] < 1024
    seq_ref, steps_ref = greedy_logits(model, ids, 4)
    seq_got, steps_got = greedy_logits(model, ids, 4, call.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-5)
    assert engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=2).usage.prompt_tokens == ids.shape[1]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_identity_holds_after_the_model_is_cast_once_the_engine_exists(family, tokenizer):
    """``model.to(torch.bfloat16)`` after ``QGPM(model, ...)`` rounds HF's inv_freq buffers; the
    model then rotates with the rounded frequencies, and so must the engine's plans."""
    model = tiny_model(family, len(tokenizer), rope_parameters={"rope_type": "default", "rope_theta": 500000.0}) if family == "llama" \
        else tiny_model(family, len(tokenizer))
    engine = QGPM(model, tokenizer, heads=[(1, 0)], config=IDENTITY)
    before = engine.rotary
    model.to(torch.bfloat16)
    assert engine.rotary is not before
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    torch.testing.assert_close(prefill_logits(model, ids, call.plan), prefill_logits(model, ids), rtol=0, atol=0)
    assert engine.rotary is engine.rotary  # read again only when the buffers change


@pytest.mark.parametrize("rope, why", [
    ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, "change with the sequence length"),
    ({"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, "qgpm does not implement it"),
])
def test_unsupported_rope_types_are_refused_with_their_reason_before_any_forward(rope, why, tokenizer):
    from qgpm import UnsupportedModelError

    model = tiny_model("llama", len(tokenizer), rope_parameters=rope)
    engine = QGPM(model, tokenizer, heads=[(1, 0)])
    forwards = []
    handle = decoder_layers(model)[0].register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(UnsupportedModelError, match=f"RoPE type '{rope['rope_type']}'.*{why}.*method='vanilla'"):
            engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=2)
        assert forwards == []
        assert engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=2).usage.answer_tokens == 2
    finally:
        handle.remove()


def test_a_lora_model_runs_as_the_peft_wrapper_computes_it(tokenizer):
    """A PEFT wrapper (a user's LoRA fine-tune, not merged): the engine runs the model inside it
    with the adapter active, so an identity plan and vanilla generation equal the wrapper's own;
    a prompt-learning adapter (virtual tokens QGPM does not place) is refused up front."""
    from peft import LoraConfig, PromptTuningConfig, get_peft_model

    from qgpm import UnsupportedModelError

    wrapped = get_peft_model(tiny_model("llama", len(tokenizer)), LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj"],
                                                                                init_lora_weights=False))
    engine = QGPM(wrapped, tokenizer, heads=[(1, 0)], config=IDENTITY)
    assert engine.model is wrapped.get_base_model() and engine._support_error is None
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    with torch.inference_mode():
        ref = wrapped(input_ids=ids).logits
        with wrapped.disable_adapter():
            plain = wrapped(input_ids=ids).logits
    assert not torch.allclose(ref, plain)  # the adapter changes the model
    torch.testing.assert_close(prefill_logits(engine.model, ids, call.plan), ref, rtol=0, atol=1e-5)
    with torch.inference_mode():
        want = wrapped.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    got = engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=4)
    assert got.text == tokenizer.decode(want[0, ids.shape[1]:], skip_special_tokens=True).strip()
    prompted = get_peft_model(tiny_model("llama", len(tokenizer)), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    with pytest.raises(UnsupportedModelError, match="virtual tokens"):
        QGPM(prompted, tokenizer, heads=[(1, 0)])


def test_model_window_reads_yarn_in_every_config_shape():
    from types import SimpleNamespace

    from qgpm.limits import model_window

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert model_window(SimpleNamespace(max_position_embeddings=32768, rope_parameters=yarn)) == 131072
    assert model_window(SimpleNamespace(max_position_embeddings=32768, rope_parameters=None,
                                        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})) == 131072
    per_kind = {"full_attention": dict(yarn, factor=2.0), "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert model_window(SimpleNamespace(max_position_embeddings=32768, rope_parameters=per_kind)) == 65536
    # a config already past factor x original keeps its own value; other RoPE types keep max_position_embeddings
    assert model_window(SimpleNamespace(max_position_embeddings=200000, rope_parameters=yarn)) == 200000
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert model_window(SimpleNamespace(max_position_embeddings=131072, rope_parameters=llama3)) == 131072
    assert model_window(SimpleNamespace(max_position_embeddings=2048, rope_parameters={"rope_type": "linear", "factor": 2.0})) == 2048
    assert model_window(SimpleNamespace()) == 0


def test_identity_sdpa_matches_too(tokenizer):
    model = tiny_model("qwen3", len(tokenizer), attn_implementation="sdpa")
    engine = QGPM(model, tokenizer, heads=[(1, 0)], config=IDENTITY)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids
    seq_ref, steps_ref = greedy_logits(model, ids, 5)
    seq_got, steps_got = greedy_logits(model, ids, 5, call.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-5)


@pytest.mark.real_model
def test_identity_real_smollm2_1k_tokens(smollm):
    from importlib import resources

    text = (resources.files("qgpm") / "data" / "sample" / "harbor_report.md").read_text()
    context = text[: len(text) // 2]
    call = smollm.prepare(context, "Who calibrated the new tide gauge?", method="qgpm", config=IDENTITY)
    ids = call.prompt.input_ids
    assert ids.shape[1] >= 1000
    seq_ref, steps_ref = greedy_logits(smollm.model, ids, 5)
    seq_got, steps_got = greedy_logits(smollm.model, ids, 5, call.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-4)


@pytest.mark.real_model
def test_identity_real_gemma3_270m(gemma3_270m):
    """Real Gemma-3-270M weights: local (base 1e4, window 512) and global (base 1e6) layers; a
    prompt longer than the window; every score 1 reproduces the unpatched model."""
    from importlib import resources

    model = gemma3_270m.model
    assert model.config.model_type == "gemma3_text"
    assert {"sliding_attention", "full_attention"} == set(model.config.layer_types)
    text = (resources.files("qgpm") / "data" / "sample" / "harbor_report.md").read_text()
    call = gemma3_270m.prepare(text[: len(text) // 2], "Who calibrated the new tide gauge?", method="qgpm", config=IDENTITY)
    ids = call.prompt.input_ids
    assert ids.shape[1] > model.config.sliding_window
    seq_ref, steps_ref = greedy_logits(model, ids, 5)
    seq_got, steps_got = greedy_logits(model, ids, 5, call.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-4)


def test_unmodulated_layers_keep_vanilla_rotation(tokenizer):
    """``unmodulated_layers = n_layers`` is exactly vanilla whatever the scores; fewer changes the logits,
    and the hidden state entering the first modulated layer is still vanilla's."""
    model = tiny_model("llama", len(tokenizer))
    n = len(decoder_layers(model))
    engine = QGPM(model, tokenizer, heads=[(1, 0)], config=STRONG)
    ids = engine.prepare(CONTEXT, QUESTION, method="qgpm").prompt.input_ids
    ref = prefill_logits(model, ids)
    off = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=STRONG.with_(unmodulated_layers=n))
    assert off.plan.layer_map == [None] * n
    torch.testing.assert_close(prefill_logits(model, ids, off.plan), ref, rtol=0, atol=1e-5)
    seq_ref, steps_ref = greedy_logits(model, ids, 4)
    seq_got, steps_got = greedy_logits(model, ids, 4, off.plan)
    assert torch.equal(seq_got, seq_ref)
    torch.testing.assert_close(steps_got, steps_ref, rtol=0, atol=1e-5)
    part = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=STRONG.with_(unmodulated_layers=1))
    assert part.plan.layer_map[0] is None and part.plan.layer_map[1:] == [0] * (n // 2 - 1) + [1] * (n - n // 2)
    h_ref, _ = _layer_input(model, ids, 1)
    h_got, got = _layer_input(model, ids, 1, part.plan)
    torch.testing.assert_close(h_got, h_ref, rtol=0, atol=0)  # layer 0 ran with vanilla positions
    assert (got - ref).abs().max() > 1e-4
    for layer in decoder_layers(model):
        assert not layer._forward_pre_hooks


def test_each_layer_receives_its_own_maps_rows_in_prefill_and_decode(tokenizer):
    """The hooks gather each map's cos/sin rows once per forward and share them among that
    map's layers: every layer must still get exactly ``plan.tables(its map, position_ids)``,
    broad below the split and sharp above, in the prefill and in every decode step."""
    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, heads=[(1, 0)], config=STRONG)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    plan, ids = call.plan, call.prompt.input_ids
    layers = decoder_layers(model)
    seen: list[tuple[int, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = []

    def capture(index):
        def hook(module, args, kwargs):  # registered after apply_plan's hook, so it sees what the layer gets
            seen.append((index, kwargs["position_ids"], kwargs["position_embeddings"]))

        return hook

    with apply_plan(model, plan):
        handles = [layer.register_forward_pre_hook(capture(i), with_kwargs=True) for i, layer in enumerate(layers)]
        try:
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
        finally:
            for h in handles:
                h.remove()
    assert len(seen) == 3 * len(layers)  # the prefill and two decode steps (the third token needs no forward)
    for index, pid, (cos, sin) in seen:
        pid = pid if pid.ndim == 2 else pid.unsqueeze(0)
        want_cos, want_sin = plan.tables(plan.layer_map[index], pid, cos.device, cos.dtype)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), f"layer {index} got another map's rows"
    prefill = [e for e in seen if e[1].shape[-1] == ids.shape[1]]
    broad, sharp = prefill[0][2][0], prefill[-1][2][0]
    assert plan.layer_map[0] == 0 and plan.layer_map[-1] == 1 and not torch.equal(broad, sharp)  # the maps differ here
