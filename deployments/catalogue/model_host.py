"""The catalogue's engines on one replica: which models are resident, waking and evicting them.

A replica of a stack with `models:` (common/config/models.py) hosts one
engine per resident model, each with its own engine-core and worker
processes, so a model that crashes takes only itself down. What is resident
is decided by routing/policy/residency.py from recent demand, within
`catalogue.memory_gb`; a request for a cold model wakes it, first evicting
the least wanted models that have been resident long enough. One swap runs
at a time. Where vLLM has sleep mode (GPUs; `catalogue.sleep_level`), an
evicted engine sleeps (its weights go to host memory, or are dropped at
level 2, and its KV cache is freed) and a wake resumes it; elsewhere an
evicted engine's processes stop and a wake starts a new engine, forked
from the standby of actors/fast_start.py.

A request that cannot have its model before its deadline is refused at once
(`ModelUnavailable`, a 429 with Retry-After), never parked. A model whose
engine died is dropped and woken again by its next request; a start that
fails (an engine that crashed while it started) is tried once more for the
request waiting on it, where its deadline leaves room.

To the replica the host looks like one engine (`running`, `errored`,
`engine_load`, `shutdown`), so health checks and autoscaling see the sum.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from urllib.parse import unquote

from actors.finisher import COMPLETION_PATHS, MODEL_HEADER, Finisher, header, openai_error
from actors.openai_app import EngineApp
from common.config import BatonConfig
from common.config.models import catalogue_models, check_budgets, for_model
from deployments.api.schemas import APIError
from deployments.serving import engine_pids
from routing.policy.residency import Residency

log = logging.getLogger(__name__)
FIRST_WAKE_GUESS_S = 10.0  # a model's engine start before one was measured
FIRST_RESUME_GUESS_S = 2.0  # a sleeping engine's wake before one was measured
START_RETRIES = 1  # a request whose model's start failed (its engine crashed) starts it again once, in its deadline


class ModelUnavailable(APIError):
    """The model cannot serve this request in time: 429 (or 503 when its start failed), with Retry-After."""

    def __init__(self, status: int, message: str, retry_after_s: float):
        super().__init__(status, message, "rate_limit_error" if status == 429 else "server_error",
                         code="model_loading" if status == 429 else "model_load_failed",
                         headers={"Retry-After": retry_after(retry_after_s)})
        self.retry_after_s = retry_after_s


class ModelHost:
    """The resident engines of one replica and the residency that decides them."""

    def __init__(self, cfg: BatonConfig, replica: str, events_host: str = "127.0.0.1"):
        self.cfg, self.replica, self.events_host = cfg, replica, events_host
        self.entries = {m.id: m for m in catalogue_models(cfg)}
        budgets = {i: m.budget_bytes() for i, m in self.entries.items()}
        c = cfg.catalogue
        capacity = int(c.memory_gb * 2**30) if c.memory_gb else sum(budgets.values())
        check_budgets(cfg, "the replica's config")  # `baton up` and `deploy` checked it with the file's name
        self.residency = Residency(capacity, budgets, c.min_resident_s, c.demand_half_life_s)
        self.engines: dict[str, EngineApp] = {}
        self.asleep: dict[str, EngineApp] = {}  # evicted engines in vLLM's sleep mode
        self.sleep_level = 0  # resolved by `start`
        self.apps: dict[str, Finisher] = {}
        self.in_flight: Counter = Counter()
        self.wake_s: dict[str, float] = {}  # engine starts, a running mean per model
        self.resume_s: dict[str, float] = {}  # wakes from sleep, likewise
        self.swap = asyncio.Lock()
        self._waking: dict[str, asyncio.Task] = {}  # models waking for no request in particular
        self._nice: dict[str, int] = {}  # resident model -> nice steps its engine runs below the replica
        self._ranked_at = -math.inf  # when `_prioritise` last ranked the engines
        self._rank = False  # whether engines are ranked by demand (`start`: CPU, cold_nice, permitted)
        self.on_usage = None  # set by the replica: every model's Finisher reports usage to it
        self.metrics = None  # the front's IngressMetrics, for wake and eviction counts
        self.events_replay = None  # no KV events: a catalogue's fronts serve their own engines

    async def start(self) -> None:
        """Starts the standby (if configured) and wakes the first model; raises if it cannot start."""
        self.sleep_level = sleep_level(self.cfg.catalogue.sleep_level)
        if self.cfg.catalogue.standby and not self.sleep_level:
            from actors.fast_start import use_standby

            use_standby()
        if self.cfg.catalogue.cold_nice and not self.sleep_level:
            from actors.fast_start import can_raise_priority

            self._rank = can_raise_priority()  # a demoted engine must be able to come back
        await self._wake(self.cfg.model.served_name, time.monotonic())

    # -- requests ---------------------------------------------------------------

    def known(self, model: str) -> bool:
        return model in self.entries

    async def acquire(self, model: str, deadline_s: float) -> Finisher:
        """The app serving `model`, waking it if needed; counts one request in flight on it
        until `release(model)`. A start that fails is tried again START_RETRIES times where the
        deadline leaves room (an engine that crashed mid-start, `baton bench chaos --layout
        catalogue`). Raises ModelUnavailable if it cannot be had within `deadline_s`."""
        start, failed = time.monotonic(), 0
        self.residency.request(model, start)
        self._prioritise(start)
        while True:
            engine = self.engines.get(model)
            if engine is not None and not engine.errored():
                self.in_flight[model] += 1
                return self.apps[model]
            async with self.swap:
                if model in self.engines and not self.engines[model].errored():
                    continue
                await self._drop(model)
                now = time.monotonic()
                plan = self._plan(model, now)
                ready_in = plan.wait_s + self._wake_guess(model)
                if now - start + ready_in > deadline_s:
                    if math.isfinite(plan.wait_s) and model not in self._waking:
                        # It wakes anyway, as soon as it can, for the retry Retry-After asks for.
                        give_up = now + ready_in + self.cfg.catalogue.min_resident_s
                        self._waking[model] = asyncio.ensure_future(self._wake_alone(model, give_up))
                    raise ModelUnavailable(429, f"The model '{model}' is not loaded and cannot be loaded within "
                                           "this request's deadline; retry later", ready_in)
                if plan.wait_s <= 0:
                    try:
                        await self._swap_in(model, plan.evict, now)
                    except ModelUnavailable:
                        failed += 1
                        if failed > START_RETRIES:
                            raise
                        log.warning("model %s failed to start; starting it again for a waiting request", model)
                    continue
            await asyncio.sleep(plan.wait_s)  # outside the lock: other models' swaps go on meanwhile

    async def _wake_alone(self, model: str, give_up_at: float) -> None:
        """Wakes `model` for no request in particular (one whose deadline was too short asked) as soon
        as residency allows, until `give_up_at`; a failed start is only counted (the next request sees it)."""
        try:
            while time.monotonic() < give_up_at:
                async with self.swap:
                    now = time.monotonic()
                    plan = self._plan(model, now)
                    if plan.wake is None and plan.reason != "pinned":
                        return
                    if plan.wait_s <= 0:
                        await self._swap_in(model, plan.evict, now)
                        return
                await asyncio.sleep(min(plan.wait_s, max(0.0, give_up_at - time.monotonic())))
        except ModelUnavailable:
            pass
        finally:
            self._waking.pop(model, None)

    def _wake_guess(self, model: str) -> float:
        if model in self.asleep:
            return self.resume_s.get(model, FIRST_RESUME_GUESS_S)
        return self.wake_s.get(model, FIRST_WAKE_GUESS_S)

    def _plan(self, model: str, now: float):
        """Residency's plan for waking `model`; models with requests in flight are never victims."""
        return self.residency.plan(model, now, busy={m for m, n in self.in_flight.items() if n})

    def release(self, model: str) -> None:
        """Ends one request `acquire` counted on `model`."""
        self.in_flight[model] -= 1

    # -- swaps (under `swap`) ------------------------------------------------------

    async def _swap_in(self, model: str, victims: tuple[str, ...], now: float) -> None:
        """Stops `victims`, then starts `model` (ModelUnavailable if it fails)."""
        for victim in victims:
            await self._drop(victim)
        await self._wake(model, now)

    async def _wake(self, model: str, now: float) -> None:
        """Resumes `model`'s sleeping engine, or starts one; on failure the catalogue is as before and
        ModelUnavailable says why."""
        self.residency.woke(model, now)
        t0 = time.monotonic()
        engine = await self._resume(model)
        times = self.resume_s
        if engine is None:
            engine, times = await self._start(model), self.wake_s
        took = time.monotonic() - t0
        times[model] = took if model not in times else 0.5 * (times[model] + took)
        self.engines[model] = engine
        self.apps[model] = Finisher(engine.direct, self.replica, lambda *answer: self.on_usage and self.on_usage(*answer))
        if self.metrics is not None:
            self.metrics.model_wakes.labels(model).inc()
            self.metrics.model_wake_s.labels(model).observe(took)
        self._prioritise(time.monotonic(), force=True)

    def _prioritise(self, now: float, force: bool = False) -> None:
        """Runs the engines of residency's hot set (`favoured`) at the replica's priority and the other
        resident ones `catalogue.cold_nice` steps below it, so the hot models keep the cores while cold
        ones are served; CPU engines only. Re-ranks at most once a second unless `force`. Changes the
        engines' threads' priorities."""
        if not self._rank or (not force and now - self._ranked_at < 1.0):
            return
        from actors.fast_start import serving_priority

        self._ranked_at = now
        favoured = self.residency.favoured(now)
        for model, engine in self.engines.items():
            below = 0 if model in favoured else self.cfg.catalogue.cold_nice
            if self._nice.get(model) != below:
                serving_priority(engine_pids(engine), below)
                self._nice[model] = below

    async def _resume(self, model: str) -> EngineApp | None:
        """Wakes `model`'s sleeping engine (reloading its weights after a level-2 sleep); None if it
        has none, or if it died asleep or failed to wake (then it is stopped)."""
        engine = self.asleep.pop(model, None)
        if engine is None:
            return None
        try:
            if engine.errored():
                raise RuntimeError("the engine died while asleep")
            if self.sleep_level == 2:
                await engine.engine.wake_up(["weights"])
                await engine.engine.collective_rpc("reload_weights")
                await engine.engine.wake_up(["kv_cache"])
            else:
                await engine.engine.wake_up()
            return engine
        except Exception as exc:  # noqa: BLE001 - a fresh start replaces an engine that cannot wake
            log.warning("model %s could not wake from sleep (%r); starting a new engine", model, exc)
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
            return None

    async def _start(self, model: str):
        """A new engine for `model`, started; raises ModelUnavailable (and leaves nothing running) if it fails."""
        entry = self.entries[model]
        if entry.runtime_env is not None:  # its own environment: a Ray actor (deployments/catalogue/model_actor.py)
            from deployments.catalogue.model_actor import RemoteEngine

            engine = RemoteEngine(self.cfg, model, self.replica, entry.runtime_env)
        else:
            engine = EngineApp(for_model(self.cfg, entry, sleep=self.sleep_level > 0), "colocated",
                               self.replica, self.events_host)
        try:
            await engine.start()
        except Exception as exc:  # noqa: BLE001 - a failed start must not leave the model listed as resident
            self.residency.evicted(model)
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
            raise ModelUnavailable(503, f"The model '{model}' failed to load ({type(exc).__name__}); retry later",
                                   5.0) from exc
        if self.cfg.catalogue.standby and not self.sleep_level and not self._rank:  # started niced
            from actors.fast_start import serving_priority

            serving_priority(engine_pids(engine))  # full priority; ranked, `_wake` sets the engine's level once
        return engine

    async def _drop(self, model: str) -> None:
        """Takes `model`'s engine out of service if it has one (evicted, or dead): a live one sleeps
        where sleep mode is on (its accelerator memory freed, `asleep` holds it), else its processes
        stop and their memory is freed."""
        engine = self.engines.pop(model, None)
        self.apps.pop(model, None)
        self._nice.pop(model, None)
        if engine is None:
            return
        self.residency.evicted(model)
        why = "died" if engine.errored() else "evicted"
        if why == "evicted" and self.sleep_level and isinstance(engine, EngineApp):
            try:
                await engine.engine.sleep(self.sleep_level)
                self.asleep[model], why = engine, "slept"
            except Exception as exc:  # noqa: BLE001 - an engine that cannot sleep is stopped instead
                log.warning("model %s could not sleep (%r); stopping it", model, exc)
        if self.metrics is not None:
            self.metrics.model_evictions.labels(model, why).inc()
        if why != "slept":
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)

    # -- what the replica and the front read ---------------------------------------

    def listing(self) -> list[dict]:
        """/v1/models' entries: every catalogue model, whether it is resident here, its budget and, when
        resident, its engine processes' PIDs."""
        return [{"id": i, "object": "model", "created": 0, "owned_by": "baton",
                 "baton": {"resident": self.resident_here(i), "asleep": i in self.asleep,
                           "memory_bytes": self.residency.budgets[i],
                           "pids": engine_pids(self.engines[i]) if i in self.engines else []}}
                for i in self.entries]

    def resident_here(self, model: str) -> bool:
        engine = self.engines.get(model)
        return engine is not None and not engine.errored()

    async def __call__(self, scope, receive, send):
        """ASGI, for requests that did not pass through this replica's front: a completion another
        replica's front forwarded (its model in `x-baton-model`) runs on that model, woken if cold;
        the routes that name no model (/tokenize, /version, ...) run on any resident model's app."""
        model = unquote(header(scope["headers"], MODEL_HEADER)) if scope["path"] in COMPLETION_PATHS else ""
        if not model:
            app = next(iter(self.apps.values()), None)
            if app is not None:
                return await app(scope, receive, send)
            return await _respond(send, 503, openai_error(503, "no model is loaded; retry later"), {"Retry-After": "5"})
        if not self.known(model):
            return await _respond(send, 404, openai_error(404, f"The model '{model}' does not exist",
                                                          "model_not_found", "model"))
        try:
            app = await self.acquire(model, self.cfg.admission.default_deadline_s)
        except ModelUnavailable as exc:
            return await _respond(send, exc.status, exc.body(), exc.headers)
        try:
            await app(scope, receive, send)
        finally:
            self.release(model)

    def running(self) -> int:
        return sum(e.running() for e in self.engines.values())

    def errored(self) -> bool:
        """Never for a model: a dead one is dropped and woken again by its next request."""
        return False

    @property
    def capacity_blocks(self) -> int:
        return sum(e.capacity_blocks for e in self.engines.values())

    async def engine_load(self) -> dict:
        return {"resident": sorted(self.engines), "asleep": sorted(self.asleep), "unfinished": self.running()}

    def shutdown(self) -> None:
        for engine in [*self.engines.values(), *self.asleep.values()]:
            engine.shutdown()
        self.engines.clear()
        self.asleep.clear()


async def _respond(send, status: int, body: dict, headers: dict | None = None) -> None:
    raw = json.dumps(body).encode()
    extra = [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *extra]})
    await send({"type": "http.response.body", "body": raw})


def sleep_level(configured: int | None) -> int:
    """`catalogue.sleep_level` resolved: as configured, or 1 where vLLM's platform has sleep mode, else 0."""
    if configured is not None:
        return configured
    from vllm.platforms import current_platform

    return 1 if current_platform.is_sleep_mode_available() else 0


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds))) if math.isfinite(seconds) else "60"
