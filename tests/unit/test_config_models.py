"""The model catalogue in config: one model is a catalogue of one; errors name the field and the file."""

from __future__ import annotations

import pytest

from actors import engine_args
from common.config import ConfigError, load_config
from common.config.models import CATALOGUE_DIR, catalogue_models, for_model
from common.constants import REPO_ROOT
from tests.unit.test_config import write


def test_single_model_is_a_catalogue_of_one():
    cfg = load_config(None, environ={})
    (only,) = catalogue_models(cfg)
    assert only.id == cfg.model.served_name and only.resolved_path() == cfg.model.resolved_path()


def test_shipped_catalogue_has_distinct_generated_models_and_overcommits():
    cfg = load_config(REPO_ROOT / "cluster" / "catalogue.yaml", environ={})
    entries = catalogue_models(cfg)
    assert 4 <= len(entries) <= 6
    specs = {(m.generate.size, m.generate.seed) for m in cfg.models}
    assert len(specs) == len(cfg.models) and all(m.resolved_path() == CATALOGUE_DIR / m.id for m in cfg.models)
    budgets = sum(m.kv_cache_gb for m in entries)  # weights come on top
    assert budgets >= 2 * cfg.catalogue.memory_gb


def test_for_model_builds_that_models_engine_config(tmp_path):
    cfg = load_config(write(tmp_path, """
colocated: true
decode: {engine_args: {max_num_seqs: 8}}
models: [{id: other, path: /ckpt/other, kv_cache_gb: 0.5, engine_args: {max_num_batched_tokens: 512}}]
"""), environ={})
    one = for_model(cfg, cfg.models[0])
    assert one.model.served_name == "other" and one.model.path == "/ckpt/other" and one.models == []
    assert one.decode.kv_cache_gb == 0.5
    assert one.decode.engine_args == {"max_num_seqs": 8, "max_num_batched_tokens": 512}
    assert engine_args.engine_kwargs(one, "colocated")["model"] == "/ckpt/other"
    assert for_model(cfg, catalogue_models(cfg)[0]).model == cfg.model


def test_sleep_mode_reaches_every_models_engine_and_cpu_swaps_processes(tmp_path):
    from deployments.catalogue.model_host import sleep_level

    cfg = load_config(write(tmp_path, """
colocated: true
models: [{id: other, path: /ckpt/other}]
catalogue: {sleep_level: 2}
"""), environ={})
    assert cfg.catalogue.sleep_level == 2
    for entry in catalogue_models(cfg):
        assert engine_args.engine_kwargs(for_model(cfg, entry, sleep=True), "colocated")["enable_sleep_mode"] is True
        assert "enable_sleep_mode" not in engine_args.engine_kwargs(for_model(cfg, entry), "colocated")
    assert sleep_level(2) == 2 and sleep_level(0) == 0
    assert sleep_level(None) == 0  # auto: vLLM's CPU platform has no sleep mode; processes are swapped


@pytest.mark.parametrize("text, field", [
    ("colocated: true\nmodels: [{id: baton-tiny}]", "appears twice"),
    ("colocated: true\nmodels: [{id: a}, {id: a}]", "appears twice"),
    ("models: [{id: a}]", "colocated stacks"),
    ("colocated: true\nmodels: [{id: 'bad id'}]", "models.0.id"),
    ("colocated: true\nmodels: [{id: a, kv_cache_gb: 0}]", "models.0.kv_cache_gb"),
    ("colocated: true\nmodels: [{id: a, speed: 3}]", "models.0.speed"),
    ("colocated: true\ncatalogue: {sleep_level: 3}", "catalogue.sleep_level"),
    ("colocated: true\nmodels: [{id: a, runtime_env: {conda: x}}]", "unknown runtime_env fields ['conda']"),
    ("colocated: true\nmodels: [{id: a, runtime_env: {env_vars: {A: 1}}}]", "env_vars values must be strings"),
])
def test_bad_catalogue_is_named_with_the_file(tmp_path, text, field):
    with pytest.raises(ConfigError, match="baton.yaml") as err:
        load_config(write(tmp_path, text), environ={})
    assert field in str(err.value)


def test_unknown_engine_arg_of_an_entry_is_named(tmp_path):
    path = write(tmp_path, "colocated: true\nmodels: [{id: a, engine_args: {warp_speed: 9}}]")
    with pytest.raises(ConfigError, match=r"models\.0\.engine_args\.warp_speed: not a vLLM engine argument"):
        engine_args.validate(load_config(path, environ={}), str(path))


def test_a_model_bigger_than_the_catalogue_room_is_named(tmp_path):
    path = write(tmp_path, "colocated: true\ndecode: {kv_cache_gb: 0.25}\ncatalogue: {memory_gb: 0.5}\n"
                           "models: [{id: a, path: /x, memory_gb: 0.75}]")
    with pytest.raises(ConfigError, match=r"models\.0: a needs 0\.75 GiB, more than catalogue\.memory_gb"):
        engine_args.validate(load_config(path, environ={}), str(path))


def test_engine_arg_names_read_from_vllms_source_are_its_dataclass_fields():
    """`baton up` checks engine_args names without importing vLLM (10-20 CPU-s); a vLLM upgrade
    that declares its arguments another way fails here."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    assert engine_args.engine_arg_names() == {f.name for f in dataclasses.fields(AsyncEngineArgs)}
