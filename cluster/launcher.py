"""The embedded local stack behind `baton up`.

Starts, in order: the default model (generated if absent), Redis, the Mooncake
master and store, HAProxy on the public port if `serve.ingress` asks for it
(cluster/ingress.py), a Ray head (in this process, so it dies with it) and the
Baton app on Serve. `down()` stops all of it in reverse, by PID,
and touches nothing it did not start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

from cluster import default_model, ingress, loopback
from common import core_fence, engine_threads
from common.config import BatonConfig
from common.listeners import is_loopback
from common.processes import ManagedProcess, free_ports, redis_process
from cluster.rollout import rollout
from cluster.warmup_server import WarmupServer
from common.constants import RAY_NAMESPACE
from common.progress import Progress
from kvstore import mooncake

ENGINE_WARMUP_TIMEOUT_S = 900


def state_file(cfg: BatonConfig) -> Path:
    return cfg.state_path() / "state.json"


class LocalStack:
    def __init__(self, cfg: BatonConfig, config_source: str, progress: Progress | None = None):
        self.cfg = cfg
        self.source = config_source
        self.config_path = config_source if Path(config_source).is_file() else None
        self.state_dir = cfg.state_path()
        self.log_dir = self.state_dir / "logs"
        self.progress = progress or Progress(total=8)
        self.children: list[ManagedProcess] = []
        self.ray_started = False
        self._restarted: dict[str, float] = {}
        self._loopback_env: dict[str, str] = {}
        cfg.serve.ingress = ingress.resolve(cfg.serve.ingress, on_cluster=bool(cfg.ray.address))

    # -- steps ------------------------------------------------------------------

    def _model(self) -> None:
        if self.cfg.model.path is None:
            default_model.ensure_default()
        elif not (self.cfg.model.resolved_path() / "config.json").exists():
            raise FileNotFoundError(f"model.path {self.cfg.model.path}: no config.json there")

    def _redis(self) -> None:
        """Starts Redis empty (a new `up` begins with fresh state, as it always has); the append-only
        file it then keeps (redis.appendfsync) is what a supervised restart of it loads again."""
        url = urlparse(self.cfg.redis.url)
        shutil.rmtree(self.state_dir / "appendonlydir", ignore_errors=True)
        self._spawn(redis_process(url.hostname or "127.0.0.1", url.port or 6379, self.state_dir,
                                  self.log_dir / "redis.log", self.cfg.redis.appendfsync))

    def _loopback(self) -> None:
        """Everything this stack starts listens on loopback (cluster/loopback), but the public port if asked."""
        s = self.cfg.serve
        public = () if is_loopback(s.host) else (s.port,)
        self._loopback_env = loopback.env(public)

    def _mooncake(self, environ: dict[str, str]) -> None:
        """Starts the Mooncake master, then the store once the master listens, each with `environ`
        (a copy: this runs beside Ray's head, which sets variables of its own) and listed in
        `self.children` as soon as it runs. About 1.4 s of waiting on their ports, not of CPU."""
        for proc in (mooncake.master_process(self.cfg.mooncake, self.log_dir),
                     mooncake.store_process(self.cfg.mooncake, self.log_dir)):
            proc.env.update(self._loopback_env)
            proc.start(environ)
            self.children.append(proc)
            proc.wait_ready(timeout=30)

    def _ingress(self) -> None:
        """With `serve.ingress` haproxy: HAProxy on the public port, the replicas' fronts behind it on a
        loopback port (picked here unless `serve.front_port` names one), which the replicas read from
        this config. With direct, nothing: the replicas' fronts listen on the public port."""
        s = self.cfg.serve
        if s.ingress != "haproxy":
            return
        if not s.front_port:
            s.front_port = free_ports(1)[0]
        for proc in ingress.haproxy_processes(s.host, s.port, s.front_port, s.request_timeout_s,
                                              self.state_dir, self.log_dir):
            self._spawn(proc)

    def _ray(self) -> None:
        import ray

        if self.cfg.ray.address:
            ray.init(address=self.cfg.ray.address, namespace=RAY_NAMESPACE, logging_level="WARNING")
        else:
            resources: dict[str, float] = {}
            for pool in (self.cfg.prefill, self.cfg.decode):
                for key, amount in pool.resources.resources.items():
                    resources[key] = resources.get(key, 0) + amount * pool.replicas
            # Ray starts workers at nice 15; an engine replica is the one
            # process that must not yield the CPU (measured: the load's own
            # client otherwise outranks the engine on a small machine).
            os.environ.setdefault("RAY_worker_niceness", "0")
            # Ray's one-machine mode: node IP 127.0.0.1, so every Ray server binds loopback.
            loopback.use_local_ray()
            # ray.init installs its own SIGTERM handler; the caller's must stay,
            # or a SIGTERM during the engines' warm-up leaves Redis and Mooncake behind.
            handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
            ray.init(num_cpus=self._cores(), resources=resources or None,
                     include_dashboard=False, namespace=RAY_NAMESPACE, logging_level="WARNING")
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        self.ray_started = True

    def _serve(self, worker_cfg: Path) -> None:
        from ray import serve

        from cluster.deploy import app_policy, autoscaling_overrides, rewrite
        from deployments.app import build_app

        # No Serve HTTP proxy: the decode replicas' fronts take the requests (on the public port, or behind HAProxy).
        serve.start(proxy_location="Disabled")
        warmup = WarmupServer(*self.cfg.serve.front_bind()).start()
        # Replicas that Ray starts after the fence (below) take back this process's CPUs first.
        env = {**self._loopback_env, **({} if self.cfg.ray.address else core_fence.cpus_env())}
        app = build_app(self.cfg, worker_cfg, env, self._threads())
        scaled = autoscaling_overrides(self.cfg, self.config_path)  # pools with an `autoscaling` section
        try:
            rollout(rewrite(app, scaled) if scaled else app, self.progress, ENGINE_WARMUP_TIMEOUT_S,
                    app_policy=app_policy(self.cfg, self.config_path))
        finally:
            warmup.stop()

    def _threads(self) -> dict[str, str]:
        """The engines' thread split when this process started Ray's only node; {} on a cluster.
        An autoscaled pool counts with its most replicas: they would share the same cores."""
        if self.cfg.ray.address:
            return {}
        c = self.cfg
        most = {name: max(p.replicas, p.autoscaling.max_replicas if p.autoscaling else 0)
                for name, p in (("prefill", c.prefill), ("decode", c.decode))}
        engines = engine_threads.local_engines(c.colocated, most["prefill"], most["decode"])
        return engine_threads.thread_env(engines, self._cores())

    def _cores(self) -> int:
        """CPUs of the local Ray head, which its engines share."""
        return self.cfg.ray.num_cpus or os.cpu_count()

    def _spawn(self, proc: ManagedProcess) -> None:
        proc.start()
        self.children.append(proc)
        proc.wait_ready(timeout=30)

    # -- lifecycle ------------------------------------------------------------------

    def up(self) -> None:
        """Starts every component; on failure stops what was started and raises."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        p = self.progress
        try:
            with p.step("default model"):
                self._model()
            with p.step("loopback shim"):
                if not self.cfg.ray.address:
                    self._loopback()
            with p.step("redis"):
                if self.cfg.redis.start_local:
                    self._redis()
            # Leaving the block waits for the thread, so down() below also stops what it started.
            with ThreadPoolExecutor(1, thread_name_prefix="baton-mooncake") as pool:
                mooncake_up = pool.submit(self._mooncake, dict(os.environ))
                with p.step(f"ingress ({self.cfg.serve.ingress})"):
                    self._ingress()
                with p.step("ray head (the mooncake master and store start beside it)"):
                    self._ray()
            with p.step("mooncake master and store"):
                mooncake_up.result()
                worker_cfg = mooncake.write_worker_config(self.cfg.mooncake, self.state_dir / "mooncake.json")
            with p.step("serve app (prefill and decode engines)"):
                self._serve(worker_cfg)
            with p.step("ready check"):
                self._write_state()
            # Ray's daemons and workers, Redis and Mooncake off the cores vLLM bound a worker to
            # (not a catalogue's: its replicas start engines later, which must see every core).
            if not self.cfg.models:
                core_fence.fence(core_fence.tree(os.getpid()))
        except BaseException:
            self.down()
            raise

    def _write_state(self) -> None:
        import ray

        state = {
            "pid": os.getpid(),
            "config": self.source,
            "started": time.time(),
            "ray_address": ray.get_runtime_context().gcs_address,
            "ray_session_dir": ray._private.worker._global_node.get_session_dir_path(),
            "children": {c.name: c.pid for c in self.children},
            "url": f"http://{self.cfg.serve.host}:{self.cfg.serve.port}",
        }
        state_file(self.cfg).write_text(json.dumps(state, indent=2))

    def revive(self, now: float, backoff_s: float = 5.0) -> list[str]:
        """Restarts children that exited (at most once per `backoff_s` each).

        Serving goes on without them meanwhile (a dead store means requests
        recompute their KV); returns the names restarted.
        """
        revived = []
        for child in self.children:
            if child.alive() or now - self._restarted.get(child.name, 0.0) < backoff_s:
                continue
            self._restarted[child.name] = now
            child.start()
            revived.append(child.name)
        if revived:
            self._write_state()
        return revived

    def down(self) -> None:
        """Stops Serve, Ray and the children in reverse order; idempotent."""
        if self.ray_started:
            import ray
            from ray import serve

            try:
                serve.shutdown()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            ray.shutdown()
            self.ray_started = False
        for child in reversed(self.children):  # all asked first: the Mooncake master alone takes 1 s
            child.terminate()
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        state_file(self.cfg).unlink(missing_ok=True)
