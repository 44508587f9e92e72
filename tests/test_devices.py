"""Where the engine puts its inputs and at what precision it computes, on hardware this CPU can
stand in for: an embedding accelerate offloaded, a GPU that only emulates bfloat16, a device
without float64."""

from __future__ import annotations

import pytest
import torch

from qgpm import QGPM, QGPMConfig, UnsupportedModelError
from qgpm.runtime import decoder_layers

from qgpm_testing import save_tiny

CONTEXT = " ".join(f"Sentence number {i} talks about topic {i % 7} and a few other things." for i in range(25)) \
    + " The secret code of the vault is 4417. " + " ".join(f"Filler line {i} is here." for i in range(20))
QUESTION = "What is the secret code of the vault?"
MOVES = QGPMConfig(relevance="heads", keep_length=0, s_low=0.05, min_top_z=None, decisive_margin=None, pass1_dtype=None)


def test_an_offloaded_embedding_takes_inputs_on_the_device_accelerate_runs_it_on(tmp_path, tokenizer):
    """accelerate leaves an offloaded module's weights on ``meta``; the inputs belong on the
    device it runs the module on (here the CPU), and the answers equal the plain load's."""
    pytest.importorskip("accelerate")
    folder = save_tiny(tmp_path / "model", tokenizer, "llama")
    plain = QGPM.from_pretrained(str(folder), heads=[(1, 0), (2, 1)], dtype=torch.float32)
    device_map = {"model.embed_tokens": "disk", **{f"model.layers.{i}": "cpu" for i in range(len(decoder_layers(plain.model)))},
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    offloaded = QGPM.from_pretrained(str(folder), heads=[(1, 0), (2, 1)], dtype=torch.float32, device_map=device_map,
                                     offload_folder=str(tmp_path / "offload"))
    assert offloaded.model.get_input_embeddings().weight.device.type == "meta"
    assert offloaded.device == torch.device("cpu")
    for method in ("vanilla", "qgpm"):
        got = offloaded.answer(CONTEXT, QUESTION, method=method, max_new_tokens=4, config=MOVES)
        want = plain.answer(CONTEXT, QUESTION, method=method, max_new_tokens=4, config=MOVES)
        assert got.text == want.text
    assert [r.z for r in got.relevance] == [r.z for r in want.relevance]


@pytest.mark.parametrize("major, native", [(7, False), (8, True), (9, True)])
def test_bfloat16_counts_as_fast_only_where_the_gpu_multiplies_it_natively(major, native, monkeypatch):
    """On a T4 / V100 (compute capability 7.x) torch says bfloat16 is supported (emulated);
    pass1_dtype='auto' must not pick it there, and the judge reranker loads in float16."""
    from qgpm import rerank
    from qgpm.pass1 import fast_on

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fast_on(torch.device("cuda:0"), torch.bfloat16) is native
    assert fast_on(torch.device("cuda:0"), torch.float16) is True
    assert rerank._auto_placement()["dtype"] == (torch.bfloat16 if native else torch.float16)


def test_rope_baselines_refuse_a_device_without_float64_before_any_forward(tokenizer, monkeypatch):
    """Apple's MPS has no float64, which the RoPE baselines compute their angles in: refused up
    front, naming the device; the engine's own methods build float32 tables and are not refused."""
    from qgpm.baselines.plans import build_baseline_plan
    from qgpm.baselines import resolve_options
    from qgpm_testing import tiny_model

    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)])
    with pytest.raises(UnsupportedModelError, match="float64, which the mps device"):
        build_baseline_plan("string", resolve_options("string", None), n_tokens=600, rotary=engine.rotary, n_layers=4,
                            device=torch.device("mps"))
    monkeypatch.setattr(QGPM, "device", property(lambda self: torch.device("mps")))
    forwards = []
    handle = decoder_layers(engine.model)[0].register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        for method in ("string", "self-extend", "ms-poe"):
            with pytest.raises(UnsupportedModelError, match="mps"):
                engine.prepare(CONTEXT, QUESTION, method=method)
        assert forwards == []
        assert engine.prepare(CONTEXT, QUESTION, method="qgpm", config=MOVES).plan is not None
    finally:
        handle.remove()
