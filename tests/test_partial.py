"""A pass-1 model (qgpm.partial): an engine whose generation is remote loads only the decoder
layers pass 1 reads, answers exactly as the whole model does, and refuses by name what needs
the layers it left out.

The "remote" generator here is the whole model's own in-process generator, so the answers
can be compared token for token without a server (tests/test_serving.py does the same against
a real vLLM server).
"""

from __future__ import annotations

import pytest
import torch

from qgpm import QGPM
from qgpm.config import RECIPE
from qgpm.partial import LayersNotLoadedError

from qgpm_testing import NEEDLE_QUESTION, needle_context, save_tiny

MOVING = dict(keep_length=0.0, min_top_z=None, decisive_margin=None)  # the plan moves the needle at this length


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.fixture(scope="module")
def part(smollm):
    """Pass 1 on the model's own heads (the preset ranks with MiniLM and needs no layer: see the last tests)."""
    return QGPM.from_pretrained(generator=smollm.local, config=smollm.config.with_(relevance="heads"))


@pytest.mark.real_model
def test_the_pass1_model_holds_the_layers_its_heads_read_and_answers_as_the_whole_model(smollm, part):
    deepest = max(layer for layer, _ in smollm.heads)
    assert (part.layers_loaded, part.n_layers) == (deepest + 1, smollm.n_layers) and deepest + 1 < smollm.n_layers
    assert part.fingerprint == smollm.fingerprint and part.heads == smollm.heads
    layer = _bytes(smollm.model.model.layers[0])
    missing = smollm.n_layers - part.layers_loaded
    assert part.weights_not_loaded == layer * missing
    assert _bytes(smollm.model) - _bytes(part.model) == layer * missing
    ctx = needle_context(5, 30)
    cfg = smollm.config.with_(**MOVING, relevance="heads")
    a = smollm.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=16)
    b = part.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=16)
    assert b.details["pass2"] == "slot order"
    assert b.text == a.text and torch.equal(part.prepare(ctx, NEEDLE_QUESTION, config=cfg).z, smollm.prepare(ctx, NEEDLE_QUESTION, config=cfg).z)
    assert part.answer(ctx, NEEDLE_QUESTION, method="vanilla", max_new_tokens=8).text == smollm.answer(ctx, NEEDLE_QUESTION, method="vanilla",
                                                                                                   max_new_tokens=8).text


@pytest.mark.real_model
def test_what_needs_the_missing_layers_is_refused_by_name_before_any_work(smollm, part, monkeypatch):
    import qgpm.pass1

    def pass1_ran(*a, **k):
        raise AssertionError("pass 1 ran for a call that needs layers not loaded")

    ctx = needle_context(3, 12)
    call = part.prepare(ctx, NEEDLE_QUESTION, max_new_tokens=4)
    monkeypatch.setattr(qgpm.pass1, "head_token_logits", pass1_ran)
    with pytest.raises(LayersNotLoadedError, match="pass1_layers_only=False"):
        part.answer_logprob(ctx, NEEDLE_QUESTION, "tangerine")
    with pytest.raises(LayersNotLoadedError, match="24 of 30"):
        part.generate_prepared(call, max_new_tokens=4, score=" tangerine")
    with pytest.raises(LayersNotLoadedError):
        part.use_generator(None)
    with pytest.raises(LayersNotLoadedError, match="head calibration"):
        part.set_heads("calibrate")
    kept = part.heads
    try:
        part.set_heads([(29, 0)])  # a head in a layer not loaded: the call that would read it says so
        with pytest.raises(LayersNotLoadedError, match=r"\(29, 0\)"):
            part.answer(ctx, NEEDLE_QUESTION, max_new_tokens=4)
    finally:
        part.set_heads(kept)
    monkeypatch.undo()
    assert part.generator is smollm.local and part.answer(ctx, NEEDLE_QUESTION, max_new_tokens=8).text  # still usable
    with pytest.raises(ValueError, match="needs generator="):
        QGPM.from_pretrained(pass1_layers_only=True)
    with pytest.raises(TypeError, match="pass1_layers_only"):
        QGPM.from_pretrained(generator=smollm.local, pass1_layers_only="yes")
    with pytest.raises(LayersNotLoadedError, match="reads every layer"):
        QGPM.from_pretrained(generator=smollm.local, heads="calibrate")


@pytest.mark.real_model
def test_a_reranker_relevance_source_loads_one_layer(smollm):
    assert smollm.config.relevance == "minilm"  # the SmolLM2 preset
    light = QGPM.from_pretrained(generator=smollm.local)
    cfg = smollm.config.with_(**MOVING)
    assert light.layers_loaded == 1 and light.n_layers == smollm.n_layers
    ctx = needle_context(4, 24)
    a = smollm.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=12)
    b = light.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=12)
    assert b.text == a.text and b.details["relevance_source"] == "minilm" and [s.index for s in b.top_sentences(2)] == [
        s.index for s in a.top_sentences(2)]
    with pytest.raises(LayersNotLoadedError, match="pass 1 over heads"):
        light.answer(ctx, NEEDLE_QUESTION, config=cfg.with_(relevance="heads"), max_new_tokens=4)


def test_a_layered_model_keeps_every_layer_kind_for_its_plan(tokenizer, tmp_path, one_thread):
    """Gemma 3 (sliding and global layers): the pass-1 model holds two of four layers, the plan
    is built for all four kinds, and the answer is the whole model's."""
    d = save_tiny(tmp_path / "gemma", tokenizer, "gemma3_text")
    heads = [(0, 1), (1, 2)]
    own = RECIPE.with_(relevance="heads")  # pass 1 reads the heads (the recipe ranks with MiniLM)
    whole = QGPM.from_pretrained(str(d), heads=heads, config=own)
    part = QGPM.from_pretrained(str(d), heads=heads, generator=whole.local, config=own)
    assert (part.layers_loaded, part.n_layers) == (2, 4)
    assert part.rotary.layer_kinds == whole.rotary.layer_kinds and len(part.rotary.layer_kinds) == 4
    ctx = needle_context(2, 10)
    cfg = whole.config.with_(**MOVING)
    a = whole.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=6)
    b = part.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=6)
    assert b.text == a.text and b.details["pass2"] == a.details["pass2"] == "slot order"
