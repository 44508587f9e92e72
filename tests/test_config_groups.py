"""QGPMConfig in groups (qgpm.settings): the flat config and its groups hold the same
settings, a combination the config refuses cannot be built from groups, the presets' values
and the evaluation harness's config hashes stay as they were, and PASS1_FIELDS is read from
the groups."""

from __future__ import annotations

import dataclasses
import json

import pytest

import qgpm
from qgpm import ConfidenceRules, MoveRemap, Pass1Settings, QGPMConfig, ReorderRemap, ShapingSettings, StrideRemap
from qgpm.config import PRESETS, RECIPE
from qgpm.config_files import load_config
from qgpm.defaults import PASS1_FIELDS
from qgpm.eval.hashes import config_hash, method_fingerprint
from qgpm.settings import REMAPS, REPLANNABLE_FIELDS, SETTING_GROUPS, fields_of

# Taken from the flat QGPMConfig before the groups existed: (config_hash of the fingerprint's
# "config" entry, json.dumps(cfg.to_dict())), field order and provenance included.
BEFORE: dict[str, tuple[str, str]] = {
    'QGPMConfig()': (
        'ecbe7d45d490',
        ('{"k_broad": 8.0, "t_broad": 2.0, "k_sharp": 2.0, "t_sharp": 0.5, "s_low": 0.1, "eps": 0.05, "anchor_ratio": 1.0, "tau": '
        '1.0, "anchor_basis": "context", "local_window": 0.0, "keep_length": 0.0, "unmodulated_layers": 0, "min_top_z": null, '
        '"decisive_margin": null, "z_window": null, "solo_margin": null, "split_layer": null, "query_tail": null, '
        '"exclude_newline_tokens": true, "max_heads": null, "max_sentence_chars": 600, "split_run_ons": false, "remap": "stride",'
        ' "lead_tokens": 0, "placement": "question", "local_layers": null, "term_ratio": null, "moved_order": "rank", '
        '"pass1_dtype": null, "relevance": "heads", "provenance": "initial defaults (untuned)"}'),
    ),
    'paper': (
        'ecbe7d45d490',
        ('{"k_broad": 8.0, "t_broad": 2.0, "k_sharp": 2.0, "t_sharp": 0.5, "s_low": 0.1, "eps": 0.05, "anchor_ratio": 1.0, "tau": '
        '1.0, "anchor_basis": "context", "local_window": 0.0, "keep_length": 0.0, "unmodulated_layers": 0, "min_top_z": null, '
        '"decisive_margin": null, "z_window": null, "solo_margin": null, "split_layer": null, "query_tail": null, '
        '"exclude_newline_tokens": true, "max_heads": null, "max_sentence_chars": 600, "split_run_ons": false, "remap": "stride",'
        ' "lead_tokens": 0, "placement": "question", "local_layers": null, "term_ratio": null, "moved_order": "rank", '
        '"pass1_dtype": null, "relevance": "heads", "provenance": "the paper\'s settings (App. C): remap stride, two maps"}'),
    ),
    'RECIPE': (
        'b1a29ad95377',
        ('{"k_broad": 8.0, "t_broad": 2.0, "k_sharp": 4.0, "t_sharp": 0.5, "s_low": 0.45, "eps": 0.05, "anchor_ratio": 2'
        '.0, "tau": 1.0, "anchor_basis": "context", "local_window": 0.0, "keep_length": 1024.0, "unmodulated_layers": 0'
        ', "min_top_z": "calibrated", "decisive_margin": null, "z_window": null, "solo_margin": null, "split_layer": 0,'
        ' "query_tail": null, "exclude_newline_tokens": true, "max_heads": null, "max_sentence_chars": 600, "split_run_'
        'ons": true, "remap": "reorder", "lead_tokens": 0, "placement": "question", "local_layers": null, "term_ratio":'
        ' 0.6, "moved_order": "rank", "pass1_dtype": "auto", "relevance": "minilm", "provenance": "the measured recipe '
        "(docs/tuning/recipe.md): the SmolLM2 preset's reorder with one map, K_s 4, term_ratio 0.6, keep_length 1024, s"
        'plit_run_ons, the sentences ranked by the MiniLM reranker with its calibrated confidence threshold"}'),
    ),
    "PRESETS['96f8dcdd689f9245']": (
        '487ea1210b90',
        ('{"k_broad": 8.0, "t_broad": 2.0, "k_sharp": 4.0, "t_sharp": 0.5, "s_low": 0.45, "eps": 0.05, "anchor_ratio": 2.0, "tau":'
        ' 1.0, "anchor_basis": "context", "local_window": 0.0, "keep_length": 1024.0, "unmodulated_layers": 0, "min_top_z": 2.5, '
        '"decisive_margin": null, "z_window": null, "solo_margin": null, "split_layer": 0, "query_tail": null, '
        '"exclude_newline_tokens": true, "max_heads": null, "max_sentence_chars": 600, "split_run_ons": true, "remap": "reorder",'
        ' "lead_tokens": 0, "placement": "question", "local_layers": null, "term_ratio": 0.6, "moved_order": "rank", '
        '"pass1_dtype": "auto", "relevance": "minilm", "provenance": "4K dev search: remap reorder with one map (split_layer 0), '
        's_low 0.45, K_s 4, min_top_z 2.5, keep_length 1024, term_ratio 0.6, split_run_ons, no dominance rule, pass1_dtype auto '
        '(docs/tuning/smollm2_dev_4k.md); relevance minilm by the rule of docs/tuning/relevance_sources.md on the 4K test grid"}'),
    ),
}


def _configs() -> dict[str, QGPMConfig]:
    out = {"QGPMConfig()": QGPMConfig(), "paper": QGPMConfig.paper(), "RECIPE": RECIPE}
    out.update({f"PRESETS[{k!r}]": v for k, v in PRESETS.items()})
    return out


class _Engine:
    """What method_fingerprint reads from an engine for a qgpm row."""

    name, heads, head_set, model = "stub", [(1, 0)], None, None
    tokenizer = type("ChatTokenizer", (), {"chat_template": "{{ messages }}"})()  # a chat model: no harness stop

    def pass1_precision(self, cfg: QGPMConfig) -> None:
        return None


def _variants() -> list[QGPMConfig]:
    """The presets and configs that set each remap and each rule."""
    return list(_configs().values()) + [
        RECIPE.with_(lead_tokens=64, moved_order="text", solo_margin=1.5, z_window=2.0, local_layers="modulated"),
        QGPMConfig(remap="move", placement="ends", local_layers="vanilla", decisive_margin=1.0, local_window=64.0),
        QGPMConfig(remap="stride", local_layers="vanilla", min_top_z=-0.5, keep_length=256.0, split_layer=3, anchor_basis="relevant"),
        RECIPE.with_(relevance="heads+bm25", pass1_dtype="bfloat16", query_tail=4, max_heads=8, exclude_newline_tokens=False, max_sentence_chars=300),
    ]


def _groups(cfg: QGPMConfig) -> dict:
    return {"pass1": cfg.pass1, "shaping": cfg.shaping, "confidence": cfg.confidence, "remap": cfg.remap_settings}


def test_presets_and_their_hashes_are_the_ones_taken_before_the_groups():
    configs = _configs()
    assert set(configs) == set(BEFORE), "a preset was added or removed: add its literal to BEFORE"
    for name, cfg in configs.items():
        want_hash, want_fields = BEFORE[name]
        assert json.dumps(cfg.to_dict()) == want_fields, name
        assert config_hash(method_fingerprint(_Engine(), "qgpm", config=cfg)["config"]) == want_hash, name
        assert json.dumps(QGPMConfig(**json.loads(want_fields)).to_dict()) == want_fields, name  # the JSON round trip
        again = load_config(None, ["k_sharp=" + repr(cfg.k_sharp)], base=cfg)
        assert again == cfg and hash(again) == hash(cfg)
    assert QGPMConfig() == QGPMConfig.paper() and hash(QGPMConfig()) == hash(QGPMConfig.paper())  # provenance is not compared


def test_every_field_is_in_exactly_one_group_and_the_field_order_is_kept():
    names = [f.name for f in dataclasses.fields(QGPMConfig)]
    assert names[:3] == ["k_broad", "t_broad", "k_sharp"] and names[-2:] == ["relevance", "provenance"]
    plain = [f.name for g in (Pass1Settings, ShapingSettings, ConfidenceRules, MoveRemap) for f in dataclasses.fields(g)]
    assert len(plain) == len(set(plain))
    assert set(plain) | {"remap", "provenance"} == set(names)
    assert {f.name for g in SETTING_GROUPS for f in dataclasses.fields(g)} == set(plain)
    assert set(REMAPS) == {"stride", "move", "reorder"} and all(cls.REMAP == name for name, cls in REMAPS.items())


def test_the_flat_defaults_are_the_groups_defaults():
    assert QGPMConfig.from_groups() == QGPMConfig()
    assert QGPMConfig.from_groups().to_dict() == QGPMConfig().to_dict()
    assert _groups(QGPMConfig()) == {"pass1": Pass1Settings(), "shaping": ShapingSettings(), "confidence": ConfidenceRules(), "remap": StrideRemap()}


@pytest.mark.parametrize("cfg", _variants(), ids=lambda c: f"{c.remap}-{c.relevance}-{c.s_low}-{c.local_layers}")
def test_flat_and_groups_round_trip(cfg):
    back = QGPMConfig.from_groups(**_groups(cfg), provenance=cfg.provenance)
    assert back == cfg and back.to_dict() == cfg.to_dict() and hash(back) == hash(cfg)
    assert _groups(back) == _groups(cfg)
    assert type(cfg.remap_settings) is REMAPS[cfg.remap]
    for group in (cfg.pass1, cfg.shaping, cfg.confidence, cfg.remap_settings):
        for f in dataclasses.fields(group):
            assert getattr(group, f.name) == getattr(cfg, f.name), f.name


def test_groups_build_the_config_they_name():
    cfg = QGPMConfig.from_groups(
        pass1=Pass1Settings(relevance="bm25", split_run_ons=True),
        shaping=ShapingSettings(k_sharp=4.0, s_low=0.45, split_layer=0),
        confidence=ConfidenceRules(keep_length=1024.0, term_ratio=0.6),
        remap=ReorderRemap(lead_tokens=32),
        provenance="a test",
    )
    assert cfg == QGPMConfig(relevance="bm25", split_run_ons=True, k_sharp=4.0, s_low=0.45, split_layer=0, keep_length=1024.0,
                             term_ratio=0.6, remap="reorder", lead_tokens=32)
    assert cfg.provenance == "a test" and cfg.remap_settings == ReorderRemap(lead_tokens=32)
    assert cfg.with_(remap="stride", lead_tokens=0).remap_settings == StrideRemap()
    assert cfg.with_(remap="move").remap_settings == MoveRemap(lead_tokens=32)


def test_an_option_of_another_remap_or_group_is_not_a_field():
    with pytest.raises(TypeError, match=r"StrideRemap has no field 'lead_tokens' \(it is a field of MoveRemap and ReorderRemap\)"):
        StrideRemap(lead_tokens=64)
    for name in ("placement", "moved_order"):
        with pytest.raises(TypeError, match=f"no field {name!r}"):
            StrideRemap(**{name: "ends"})
    for remap in (StrideRemap, MoveRemap, ReorderRemap):
        with pytest.raises(TypeError, match="no field 'eps' .*ShapingSettings"):
            remap(eps=0.1)
        with pytest.raises(TypeError, match="not a QGPM setting"):
            remap(k_sharpp=1.0)
    with pytest.raises(TypeError, match="no field 'min_top_z' .*ConfidenceRules"):
        ShapingSettings(min_top_z=1.0)
    with pytest.raises(TypeError, match="no field 'remap' .*ReorderRemap"):
        Pass1Settings(remap="reorder")


def test_refused_combinations_still_raise_from_flat_keywords_and_from_groups():
    refused = [
        ({"lead_tokens": 64}, "remap='move' or 'reorder'"),
        ({"placement": "ends"}, "remap='move' or 'reorder'"),
        ({"moved_order": "text"}, "remap='move' or 'reorder'"),
        ({"remap": "reorder", "local_layers": "vanilla"}, "cannot be kept by remap='reorder'"),
        ({"remap": "move", "placement": "ends", "lead_tokens": 8}, "cannot be combined"),
        ({"remap": "reorder", "placement": "ends", "moved_order": "text"}, "cannot be combined"),
        ({"k_sharp": 9.0}, "K_b > K_s"),
    ]
    for kwargs, message in refused:
        with pytest.raises(ValueError, match=message):
            QGPMConfig(**kwargs)
        with pytest.raises(ValueError, match=message):
            QGPMConfig().with_(**kwargs)
    with pytest.raises(ValueError, match="cannot be kept by remap='reorder'"):
        ReorderRemap(local_layers="vanilla")
    with pytest.raises(ValueError, match="cannot be combined"):
        MoveRemap(placement="ends", lead_tokens=8)
    with pytest.raises(ValueError, match="K_b > K_s"):
        ShapingSettings(k_sharp=9.0)
    assert MoveRemap(local_layers="vanilla").local_layers == "vanilla"


def test_from_groups_names_a_group_given_in_the_wrong_place():
    with pytest.raises(TypeError, match=r"remap must be StrideRemap, MoveRemap or ReorderRemap, got str 'reorder'; .*ReorderRemap\(\)"):
        QGPMConfig.from_groups(remap="reorder")
    with pytest.raises(TypeError, match="shaping must be ShapingSettings, got ConfidenceRules"):
        QGPMConfig.from_groups(shaping=ConfidenceRules())
    with pytest.raises(TypeError, match="pass1 must be Pass1Settings"):
        QGPMConfig.from_groups(pass1={"relevance": "bm25"})


def test_a_bad_type_names_the_class_being_built():
    for group in (Pass1Settings, ShapingSettings, ConfidenceRules, MoveRemap):
        for f in dataclasses.fields(group):
            if f.type in ("float", "int", "int | None", "bool", "float | None"):
                with pytest.raises(TypeError, match=rf"^QGPMConfig\.{f.name} must be"):
                    QGPMConfig(**{f.name: "x"})
                with pytest.raises(TypeError, match=rf"^{group.__name__}\.{f.name} must be"):
                    group(**{f.name: "x"})
    with pytest.raises(ValueError, match="min_top_z"):
        ConfidenceRules(min_top_z="x")


def test_pass1_fields_are_the_groups_that_are_not_replannable():
    pass1 = tuple(f.name for g in SETTING_GROUPS if not g.REPLANNABLE for f in dataclasses.fields(g))
    assert PASS1_FIELDS == pass1 == fields_of(replannable=False)
    assert [g for g in SETTING_GROUPS if not g.REPLANNABLE] == [Pass1Settings]
    assert set(PASS1_FIELDS).isdisjoint(REPLANNABLE_FIELDS)
    assert set(PASS1_FIELDS) | set(REPLANNABLE_FIELDS) | {"provenance"} == {f.name for f in dataclasses.fields(QGPMConfig)}
    assert "remap" in REPLANNABLE_FIELDS and "relevance" in PASS1_FIELDS and "keep_length" in REPLANNABLE_FIELDS


def test_the_groups_are_exported():
    for cls in (Pass1Settings, ShapingSettings, ConfidenceRules, StrideRemap, MoveRemap, ReorderRemap):
        assert getattr(qgpm, cls.__name__) is cls and cls.__name__ in qgpm.__all__


def test_overrides_say_so_in_the_provenance():
    from qgpm.config import RECIPE
    from qgpm.config_files import load_config

    cfg = load_config(None, ["k_sharp=3", "remap=stride"], base=RECIPE)
    assert (cfg.k_sharp, cfg.remap) == (3, "stride")
    assert cfg.provenance == f"{RECIPE.provenance}; then overridden: k_sharp=3, remap='stride'"  # not the recipe's own text alone
    assert load_config(None, [], base=RECIPE) is None
