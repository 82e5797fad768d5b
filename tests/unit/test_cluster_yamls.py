"""The `ray up` cluster YAMLs, their node scripts and `baton deploy`'s pure parts.

Every cluster YAML under cluster/ray_up/ goes through Ray's own config
handling (`prepare_config`: defaults, setup-command merging, per-type
min/max workers; then `validate_config`: ray-schema.json and the checks on
node types) offline: no cloud SDK, no network, no cluster.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster import deploy
from common.config import REPO_ROOT, BatonConfig, load_config

RAY_UP = REPO_ROOT / "cluster" / "ray_up"
SCRIPTS = RAY_UP / "scripts"
CLUSTER_YAMLS = sorted(RAY_UP.glob("*.yaml"))
BATON_CONFIGS = sorted((RAY_UP / "baton").glob("*.yaml"))
SHELL_SCRIPTS = sorted(SCRIPTS.glob("*.sh"))
ROLES = ("prefill", "decode")
# The Baton config each cluster YAML is deployed with.
BATON_CONFIG_FOR = {"local.yaml": "local.yaml"}
DEFAULT_BATON_CONFIG = "cluster.yaml"


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _ray_prepared(raw: dict, path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Ray's prepare_config, as `ray up` runs it before any cloud call."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(raw))


def _worker_types(cfg: dict) -> dict[str, dict]:
    head = cfg["head_node_type"]
    return {k: v for k, v in cfg["available_node_types"].items() if k != head}


def _all_commands(cfg: dict) -> list[str]:
    cmds: list[str] = []
    for key in ("initialization_commands", "setup_commands", "head_setup_commands",
                "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        cmds += cfg.get(key, [])
    for node_type in cfg.get("available_node_types", {}).values():
        cmds += node_type.get("worker_setup_commands", []) + node_type.get("initialization_commands", [])
    return cmds


def _script_paths(cmd: str) -> list[Path]:
    return [REPO_ROOT / m for m in re.findall(r"(cluster/ray_up/scripts/[\w.-]+)", cmd)]


def _baton_config_for(path: Path) -> BatonConfig:
    name = BATON_CONFIG_FOR.get(path.name, DEFAULT_BATON_CONFIG)
    return load_config(RAY_UP / "baton" / name, environ={})


def test_there_is_a_yaml_per_target():
    names = {p.name for p in CLUSTER_YAMLS}
    assert {"aws.yaml", "gcp.yaml", "onprem.yaml", "local.yaml"} <= names
    types = {_load(p)["provider"]["type"] for p in CLUSTER_YAMLS}
    assert {"aws", "gcp", "local", "external"} <= types


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=lambda p: p.name)
def test_ray_validates_the_cluster_yaml(path, monkeypatch):
    from ray.autoscaler._private.util import validate_config

    raw = _load(path)
    prepared = _ray_prepared(raw, path, monkeypatch)
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]
    if raw["provider"]["type"] == "external":
        # What the autoscaler monitor reads on the head: the file as it is.
        validate_config(copy.deepcopy(raw))


def test_local_yaml_needs_no_defaults_file():
    """local.yaml sets every key itself: no provider defaults file (the PyPI
    wheel lacks fake_multinode's example.yaml) is ever merged in."""
    from ray.autoscaler._private import providers

    raw = _load(RAY_UP / "local.yaml")
    schema = json.loads((Path(providers.__file__).parents[1] / "ray-schema.json").read_text())
    missing = set(schema["properties"]) - set(raw) - {"no_restart", "metadata", "provider"}
    assert not missing, f"local.yaml must be complete on its own; missing {sorted(missing)}"


@pytest.mark.parametrize("path", [p for p in CLUSTER_YAMLS if _load(p)["provider"]["type"] != "local"],
                         ids=lambda p: p.name)
def test_worker_types_advertise_role_and_accelerator(path, monkeypatch):
    prepared = _ray_prepared(_load(path), path, monkeypatch)
    workers = _worker_types(prepared)
    seen_roles = set()
    for name, node_type in workers.items():
        res = node_type["resources"]
        roles = [r for r in ROLES if res.get(r, 0) > 0]
        assert len(roles) == 1, f"{name} must advertise exactly one of {ROLES}: {res}"
        accel = [k for k in res if k.startswith("accelerator_type:")]
        assert len(accel) == 1, f"{name} must advertise its accelerator type: {res}"
        if res.get("GPU"):
            assert res[roles[0]] <= res["GPU"], f"{name}: more {roles[0]} slots than GPUs"
        assert node_type["max_workers"] >= node_type["min_workers"]
        seen_roles.add(roles[0])
    assert seen_roles == set(ROLES)
    head = prepared["available_node_types"][prepared["head_node_type"]]
    assert not set(ROLES) & set(head["resources"]), "no engine may land on the head"
    assert not head["resources"].get("GPU"), "the head is a CPU node"


@pytest.mark.parametrize("path", [p for p in CLUSTER_YAMLS if _load(p)["provider"]["type"] != "local"],
                         ids=lambda p: p.name)
def test_every_pool_has_a_node_type_that_fits(path, monkeypatch):
    """Each pool of the Baton config deployed on this cluster can be placed, and
    only on the node type of its role."""
    prepared = _ray_prepared(_load(path), path, monkeypatch)
    cfg = _baton_config_for(path)
    for role in ROLES:
        opts = getattr(cfg, role).resources.ray_actor_options()
        want = dict(opts.get("resources", {}))
        if opts.get("accelerator_type"):
            want[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
        if opts["num_gpus"]:
            want["GPU"] = opts["num_gpus"]
        fits = [n for n, t in _worker_types(prepared).items()
                if all(t["resources"].get(k, 0) >= v for k, v in want.items())]
        assert fits, f"{path.name}: no node type fits the {role} pool ({want})"
        for n in fits:
            assert prepared["available_node_types"][n]["resources"].get(role, 0) > 0, \
                f"{role} replicas could land on {n}"


def test_onprem_roles_cover_every_worker(monkeypatch):
    path = RAY_UP / "onprem.yaml"
    raw = _load(path)
    ips = raw["provider"]["worker_ips"]
    start = " ".join(raw["worker_start_ray_commands"])
    assert "worker_start.sh --ray-start" in start
    roles = dict(pair.split("=", 1) for pair in re.search(r"BATON_ROLES=(\S+)", start).group(1).split(","))
    assert set(roles) == set(ips), "BATON_ROLES must name every worker_ip"
    assert set(roles.values()) == set(ROLES)
    prepared = _ray_prepared(raw, path, monkeypatch)
    assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == len(ips)


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=lambda p: p.name)
def test_commands_reference_existing_scripts(path, monkeypatch):
    raw = _load(path)
    prepared = _ray_prepared(raw, path, monkeypatch)
    for cmd in _all_commands(raw):
        for script in _script_paths(cmd):
            assert script.is_file(), f"{path.name}: {cmd!r} calls missing {script}"
    head_start = " ".join(prepared["head_start_ray_commands"])
    assert "cluster/ray_up/scripts/head_start.sh" in head_start
    assert re.search(r"ray start --head\b", head_start)
    assert "--autoscaling-config=" in head_start
    # Baton's services come before the raylet in the start commands.
    assert head_start.index("head_start.sh") < head_start.index("ray start")
    if raw["provider"]["type"] == "external":
        return
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    setup = " ".join(prepared["head_setup_commands"])
    assert "cluster/ray_up/scripts/setup_node.sh" in setup
    worker_start = " ".join(prepared["worker_start_ray_commands"])
    assert "cluster/ray_up/scripts/worker_start.sh" in worker_start
    assert "ray start --address=$RAY_HEAD_IP:6379" in worker_start or "--ray-start" in worker_start
    for name, node_type in _worker_types(prepared).items():
        cmds = " ".join(node_type.get("worker_setup_commands", prepared["worker_setup_commands"]))
        assert "setup_node.sh --extras gpu" in cmds, f"{name} must install the GPU extras"
    assert prepared["file_mounts"].get("~/baton") == ".", "the repository must reach ~/baton"


@pytest.mark.parametrize("path", BATON_CONFIGS, ids=lambda p: p.name)
def test_baton_configs_load(path):
    cfg = load_config(path, environ={})
    assert cfg.ray.address == "auto"
    assert not cfg.colocated


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)


def test_node_env_matches_config(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("node_env", SCRIPTS / "node_env.py")
    node_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(node_env)
    out = tmp_path / "mooncake.json"
    assert node_env.main(["--config", str(RAY_UP / "baton" / "cluster.yaml"),
                          "--head-ip", "10.1.2.3", "--worker-json", str(out)]) == 0
    env = dict(shlex.split(line[len("export "):])[0].split("=", 1)
               for line in capsys.readouterr().out.splitlines())
    defaults = BatonConfig()
    assert env["BATON_REDIS_PORT"] == "6390"
    assert env["MOONCAKE_MASTER_PORT"] == str(defaults.mooncake.master_port)
    assert env["MOONCAKE_METADATA_PORT"] == str(defaults.mooncake.metadata_port)
    assert env["MOONCAKE_STORE_PORT"] == str(defaults.mooncake.store_port)
    assert env["BATON_EVENTS_PORT"] == "5557"
    worker = json.loads(out.read_text())
    assert worker["master_server_address"] == f"10.1.2.3:{defaults.mooncake.master_port}"
    assert worker["metadata_server"] == f"http://10.1.2.3:{defaults.mooncake.metadata_port}/metadata"
    assert worker["mode"] == "standalone-store" and worker["global_segment_size"] == 0


def test_localize_points_loopback_at_the_head():
    cfg = load_config(RAY_UP / "baton" / "cluster.yaml", environ={})
    out, changes = deploy.localize(cfg, "10.0.0.10")
    assert out.mooncake.host == "10.0.0.10"
    assert out.redis.url == "redis://10.0.0.10:6390/0"
    assert out.routing.events_host == "10.0.0.10"
    assert len(changes) == 3 and cfg.mooncake.host == "127.0.0.1"
    again, none = deploy.localize(out, "10.9.9.9")
    assert none == [] and again.redis.url == out.redis.url


class _Pool:
    def __init__(self, replicas, autoscaling):
        self.replicas, self.autoscaling = replicas, autoscaling


def test_pool_autoscaling_maps_to_serve():
    assert deploy.pool_autoscaling(BatonConfig().prefill, "prefill") is None
    got = deploy.pool_autoscaling(
        _Pool(3, {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 16}), "decode")
    assert got == {"min_replicas": 1, "max_replicas": 8, "initial_replicas": 3,
                   "target_ongoing_requests": 16.0,
                   "policy": {"policy_function": "deployments.autoscaling.autoscaling:in_flight_policy"}}
    assert deploy.pool_autoscaling(_Pool(20, {"max_replicas": 4}), "decode")["initial_replicas"] == 4
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**got)  # Serve accepts it
    for bad in ({"min_replicas": 5, "max_replicas": 2}, {"target_ongoing_requests": 0}, {"bogus": 1}):
        with pytest.raises(Exception):
            deploy.pool_autoscaling(_Pool(1, bad), "decode")


@pytest.mark.parametrize("text, wanted", [
    ("colocated: false\nprefill:\n  autoscaling: {forecast: {}}\ndecode:\n  autoscaling: {forecast: {}}\n", True),
    ("colocated: false\nprefill:\n  autoscaling: {forecast: {}}\n"
     "decode:\n  autoscaling: {forecast: {app_level: false}}\n", False),
    ("colocated: false\nprefill:\n  autoscaling: {max_replicas: 2}\ndecode:\n  autoscaling: {forecast: {}}\n", False),
    ("colocated: true\ndecode:\n  autoscaling: {forecast: {}}\n", False),
])
def test_the_app_level_policy_needs_both_pools_on_a_forecast(tmp_path, text, wanted):
    """Prefill and decode are scaled together only where both forecast and decode's section
    keeps `app_level` on; the policy then names both deployments, each with its own bounds."""
    from ray.serve.config import AutoscalingPolicy

    from deployments.autoscaling import autoscaling

    path = tmp_path / "baton.yaml"
    path.write_text(text.replace("prefill:\n  autoscaling: {forecast: {}}",
                                 "prefill:\n  autoscaling: {max_replicas: 5, forecast: {}}"))
    policy = deploy.app_policy(load_config(path, environ={}), path)
    assert (policy is not None) == wanted
    if wanted:
        AutoscalingPolicy(**policy)  # Serve accepts it
        pools = policy["policy_kwargs"]["pools"]
        assert policy["policy_function"] == autoscaling.APP_POLICY and policy["policy_kwargs"]["lead"] == "decode"
        assert pools["prefill"]["kind"] == "prefill" and pools["prefill"]["params"]["max_replicas"] == 5
        assert pools["decode"]["params"]["max_replicas"] == 4


def test_a_forecast_section_gives_the_pool_the_forecast_policy(tmp_path):
    """`autoscaling.forecast` swaps the policy for the forecast one, with Serve's delays at 0,
    the pool's kind and its capacity curve (the file beside the config when there is one)."""
    from ray.serve.config import AutoscalingConfig

    from common.config import load_config
    from deployments.autoscaling import autoscaling
    from deployments.autoscaling.capacity import DEFAULT_CURVE

    path = tmp_path / "baton.yaml"
    path.write_text("colocated: true\ndecode:\n  autoscaling: {max_replicas: 3, forecast: {forecaster: holt}}\n")
    got = deploy.plan(load_config(path, environ={}), path)["pools"]["decode"]["autoscaling"]
    assert got["policy"]["policy_function"] == autoscaling.FORECAST_POLICY
    assert got["upscale_delay_s"] == got["downscale_delay_s"] == 0.0
    kwargs = got["policy"]["policy_kwargs"]
    assert kwargs["kind"] == "colocated" and kwargs["params"]["forecaster"] == "holt"
    assert kwargs["params"]["max_replicas"] == 3 and kwargs["curve"]["points"]
    AutoscalingConfig(**got)  # Serve accepts it
    assert autoscaling.PoolForecastPolicy(**kwargs).kind == "colocated"  # what Serve's controller builds
    # Disaggregated, each pool its own kind; a curve file beside the config wins over the shipped one.
    path.write_text("colocated: false\nprefill:\n  autoscaling: {forecast: {}}\n")
    (tmp_path / "baton.capacity.yaml").write_text(DEFAULT_CURVE.read_text().replace("711.96", "111.0"))
    pools = deploy.plan(load_config(path, environ={}), path)["pools"]
    kwargs = pools["prefill"]["autoscaling"]["policy"]["policy_kwargs"]
    assert kwargs["kind"] == "prefill" and kwargs["curve"]["points"][0]["tokens_per_s"] == 111.0
    assert pools["decode"]["autoscaling"] is None


def test_a_bad_forecast_section_names_the_field(tmp_path):
    from common.config import ConfigError, load_config

    path = tmp_path / "baton.yaml"
    path.write_text(f"decode:\n  autoscaling: {{forecast: {{capacity_file: {tmp_path / 'none.yaml'}}}}}\n")
    with pytest.raises(ConfigError, match="decode.autoscaling.forecast"):
        deploy.plan(load_config(path, environ={}), path)
    path.write_text("decode:\n  autoscaling: {forecast: {forecaster: prophet}}\n")
    with pytest.raises(ConfigError, match="forecaster"):
        load_config(path, environ={})
    # all of the SLO for service leaves no queueing budget: any wait would add a replica
    path.write_text("decode:\n  autoscaling: {forecast: {service_fraction: 1.0}}\n")
    with pytest.raises(ConfigError, match="service_fraction"):
        load_config(path, environ={})


def test_deploy_overrides_pin_indexer_and_scale_pools(monkeypatch):
    cfg = BatonConfig()
    monkeypatch.setattr(deploy, "pool_autoscaling",
                        lambda pool, name, *_: {"min_replicas": 1, "max_replicas": 4} if name == "decode" else None)
    out = deploy.overrides(cfg)
    assert out["kv_indexer"]["ray_actor_options"]["resources"] == {deploy.HEAD_RESOURCE: 0.001}
    assert out["decode"] == {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}}
    assert "prefill" not in out


def test_rewrite_keeps_the_graph_and_applies_options():
    from ray import serve

    @serve.deployment(name="decode", num_replicas=2, ray_actor_options={"num_cpus": 0})
    class Leaf:
        pass

    @serve.deployment(name="kv_indexer", ray_actor_options={"num_cpus": 0})
    class Indexer:
        pass

    @serve.deployment(name="ingress")
    class Root:
        pass

    app = Root.bind({"k": 1}, Leaf.bind("decode"), indexer=Indexer.bind())
    auto = {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 2, "target_ongoing_requests": 8}
    new = deploy.rewrite(app, {"decode": {"autoscaling_config": auto},
                                "kv_indexer": {"ray_actor_options": {"resources": {deploy.HEAD_RESOURCE: 0.001}}}})
    root = new._bound_deployment
    assert root.init_args[0] == {"k": 1}
    leaf = root.init_args[1]._bound_deployment
    assert leaf.init_args == ("decode",)
    assert leaf._deployment_config.autoscaling_config.max_replicas == 4
    idx = root.init_kwargs["indexer"]._bound_deployment
    assert idx.ray_actor_options["resources"] == {deploy.HEAD_RESOURCE: 0.001}
    assert idx.ray_actor_options["num_cpus"] == 0


def test_deploy_dry_run(capsys):
    assert deploy.main(["--config", str(RAY_UP / "baton" / "cluster.yaml"), "--dry-run",
                        "--head-ip", "10.0.0.10"]) == 0
    out = capsys.readouterr().out
    assert '"pd_ratio": "2:4"' in out and "redis.url" in out
    assert deploy.main(["--dry-run", "--worker-config", "relative.json"]) == 2


def test_docs_name_every_port():
    text = (REPO_ROOT / "docs" / "deploy.md").read_text()
    d = BatonConfig()
    ports = [d.serve.port, d.mooncake.master_port, d.mooncake.metadata_port,
             d.mooncake.master_metrics_port, d.mooncake.store_port, d.mooncake.store_http_port,
             d.routing.events_port, 6390, 6379, 8076, 8265, 10001]
    for port in ports:
        assert re.search(rf"\b{port}\b", text), f"docs/deploy.md does not mention port {port}"


def test_in_flight_policy_scales_on_what_replicas_report():
    from deployments.autoscaling.autoscaling import in_flight_policy

    class Cfg:
        def get_target_ongoing_requests(self):
            return 4.0

    class Ctx:
        current_num_replicas, target_num_replicas, config = 2, 2, Cfg()
        aggregated_metrics = {"ongoing": {"r1": 6.0, "r2": 10.0}}

    assert in_flight_policy(Ctx())[0] == 4.0
    Ctx.aggregated_metrics = None
    assert in_flight_policy(Ctx())[0] == 0.0
