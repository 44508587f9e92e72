"""GPU checks (skipped without CUDA): exactness and modulation on the accelerator, bf16 tables."""

from __future__ import annotations

import pytest
import torch

from qgpm import QGPM, QGPMConfig
from qgpm.runtime import apply_plan, decoder_layers

from qgpm_testing import FAMILIES, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CONTEXT = " ".join(f"Sentence {i} is about topic {i % 5}." for i in range(60)) + " The code is 4417."
QUESTION = "What is the code?"


def run(model, ids, plan, steps=6):
    with apply_plan(model, plan), torch.inference_mode():
        pre = model(ids).logits
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return pre, out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype,attn,atol", [(torch.float32, "sdpa", 1e-4), (torch.bfloat16, "sdpa", 0.0), (torch.bfloat16, "eager", 0.0)])
def test_identity_on_cuda(family, dtype, attn, atol, tokenizer):
    model = tiny_model(family, len(tokenizer), attn_implementation=attn).to("cuda", dtype)
    engine = QGPM(model, tokenizer, heads=[(1, 0), (3, 2)], config=QGPMConfig(s_low=1.0))
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    ids = call.prompt.input_ids.cuda()
    ref = run(model, ids, None)
    got = run(model, ids, call.plan)
    # bf16 tables are built in fp32 from the same integer positions, then cast: bit-identical.
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=atol)
    assert torch.equal(got[1], ref[1])
    torch.testing.assert_close(got[2], ref[2], rtol=0, atol=atol)
    strong = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=QGPMConfig(s_low=0.05))
    assert (run(model, ids, strong.plan, 1)[0].float() - ref[0].float()).abs().max() > 1e-3
    assert all(not l._forward_pre_hooks for l in decoder_layers(model))


def test_answer_and_stream_on_cuda(tokenizer):
    model = tiny_model("qwen3", len(tokenizer), attn_implementation="sdpa").to("cuda", torch.bfloat16)
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)])
    res = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=8)
    stream = engine.stream(CONTEXT, QUESTION, method="qgpm", max_new_tokens=8)
    assert "".join(stream) == res.text == stream.result.text
    assert res.relevance and res.timings.pass1_s > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_reused_prefill_on_cuda(family, tokenizer):
    """Pass 1 going on as the prefill on the accelerator: a call that falls back reuses all but the
    last prompt token, with the answer and gold log-prob of a full pass 2."""
    model = tiny_model(family, len(tokenizer), attn_implementation="sdpa").to("cuda", torch.float32)
    cfg = QGPMConfig(s_low=0.1, remap="reorder", split_layer=0, min_top_z=1e6)
    on = QGPM(model, tokenizer, heads=[(1, 0), (3, 2)], config=cfg)
    off = QGPM(model, tokenizer, heads=[(1, 0), (3, 2)], config=cfg, reuse_prefill=False)
    a = on.generate_prepared(on.prepare(CONTEXT, QUESTION, method="qgpm"), max_new_tokens=6, score=" 4417")
    b = off.generate_prepared(off.prepare(CONTEXT, QUESTION, method="qgpm"), max_new_tokens=6, score=" 4417")
    assert a.details["prefill_reused"] == a.usage.prompt_tokens - 1 and b.details["prefill_reused"] == 0
    assert a.text == b.text and abs(a.details["score_logprob"] - b.details["score_logprob"]) < 1e-3
