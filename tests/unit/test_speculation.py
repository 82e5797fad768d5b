"""Speculation per pool (common/config/spec.py): config errors, engine arguments, acceptance counts."""

from __future__ import annotations

import pytest

from actors.engine_args import engine_kwargs, validate
from actors.spec_stats import SpecCollector, SpecCounts
from common.config import ConfigError, load_config


def _cfg(tmp_path, text: str):
    path = tmp_path / "baton.yaml"
    path.write_text(text)
    return load_config(path, environ={}), str(path)


def test_ngram_reaches_the_decode_engines_only(tmp_path):
    cfg, _ = _cfg(tmp_path, "colocated: false\ndecode:\n  speculation: {method: ngram, num_speculative_tokens: 3}\n")
    spec = engine_kwargs(cfg, "decode")["speculative_config"]
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert engine_kwargs(cfg, "decode")["disable_log_stats"] is False  # the counts come with the stats
    assert "speculative_config" not in engine_kwargs(cfg, "prefill")
    cfg, _ = _cfg(tmp_path, "colocated: true\ndecode:\n  speculation: {method: ngram}\n")
    assert engine_kwargs(cfg, "colocated")["speculative_config"]["method"] == "ngram"
    # on a CUDA GPU the lookup runs there (vLLM's ngram_gpu), which keeps async scheduling on
    assert engine_kwargs(cfg, "colocated", gpu=True)["speculative_config"]["method"] == "ngram_gpu"
    assert "speculative_config" not in engine_kwargs(load_config(None, environ={}), "colocated")


def test_a_draft_model_is_passed_by_path(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    cfg, source = _cfg(tmp_path, f"decode:\n  speculation: {{method: draft, draft_model: {draft}}}\n")
    assert engine_kwargs(cfg, "decode")["speculative_config"] == {
        "method": "draft_model", "num_speculative_tokens": 4, "model": str(draft)}
    validate(cfg, source)  # a draft that exists passes


@pytest.mark.parametrize("text, field", [
    ("decode:\n  speculation: {method: medusa}\n", "decode.speculation.method"),
    ("decode:\n  speculation: {method: draft}\n", "draft_model"),
    ("decode:\n  speculation: {method: ngram, prompt_lookup_min: 5, prompt_lookup_max: 3}\n", "prompt_lookup_min"),
    ("decode:\n  speculation: {method: ngram, num_speculative_tokens: 0}\n", "num_speculative_tokens"),
    ("decode:\n  engine_args: {speculative_config: {method: ngram}}\n", None),
])
def test_bad_sections_fail_naming_the_field_and_the_file(tmp_path, text, field):
    path = tmp_path / "baton.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        validate(load_config(path, environ={}), str(path))
    assert str(path) in str(exc.value)
    assert (field or "decode.engine_args.speculative_config") in str(exc.value)


def test_a_missing_draft_fails_at_start_naming_the_field_and_the_file(tmp_path):
    cfg, source = _cfg(tmp_path, f"decode:\n  speculation: {{method: eagle, draft_model: {tmp_path / 'none'}}}\n")
    with pytest.raises(ConfigError, match=r"decode\.speculation\.draft_model: .*no such directory") as exc:
        validate(cfg, source)
    assert source in str(exc.value)


def test_counts_give_the_acceptance_rate_and_mean_accepted_length():
    c = SpecCounts()
    assert c.acceptance_rate is None and "spec_acceptance_rate" not in c.summary()
    c.add(drafts=10, draft_tokens=40, accepted_tokens=30)
    c.add(drafts=10, draft_tokens=40, accepted_tokens=10)
    assert c.acceptance_rate == pytest.approx(0.5) and c.mean_accepted_length == pytest.approx(3.0)
    assert c.summary()["spec_drafts"] == 20
    families = {f.name: f.samples[0] for f in SpecCollector(c, "decode").collect()}
    assert families["baton_spec_accepted_tokens"].value == 40
    assert families["baton_spec_drafts"].labels == {"pool": "decode"}
