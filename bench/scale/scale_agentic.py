"""Agent sessions on N simulated engines: Baton's routing policy against round robin, exact times.

Runs on bench/scale/scale_fleet.py: N vLLM engine cores on the timed executor and
one virtual clock, so a TTFT is the profile's arithmetic plus vLLM's own
scheduling, with none of the host's noise. The workload (`Sessions`): each
tenant has a system prompt (its tools); each session sends turns that resend
the whole conversation (the engine's own answers included, so the prefix
cache sees what a real agent's would) plus a new tool result, after a think
time. Sessions arrive as a Poisson stream, each tagged with its session id
(the `x-session-affinity` header's value) and its tenant (the cache salt).

Routing is Baton's own code: `routing.policy.baton_router.BatonRouter` (the policy,
the prefix index and the session pins) fed with the engines' real KV events
through `routing.prefix.event_translator`, as the KV indexer feeds it; loads as the
fronts build them, and a session with no live pin placed as a front places it (by the live
sessions pinned to each replica, a ticket taking turns among the tied; until 2026-12-05 the
bench gave no ticket, so the policy drew two replicas by load in flight, which the fronts do
not). Reported per policy: TTFT p50/p99 of turn 1 and of later
turns, the cached share of prompt tokens against the oracle (one unbounded
cache that has seen every earlier block), the share of requests whose
predicted cached tokens (the index's match when routed) equal the engine's,
live sessions, and the decision's wall time.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field

from actors.sim.profile import GpuProfile
from common.stats import percentile
from routing.policy.baselines import RoundRobin
from routing.policy.baton_router import BatonRouter
from routing.prefix.block_hash import hash_blocks
from routing.policy.contracts import ReplicaLoad, RoutingRequest
from routing.prefix.event_translator import EventTranslator

VOCAB = (6, 1000)
MAX_MODEL_LEN = 32768  # no weights run: the tiny model's tokenizer and config stand in for the profiled model


@dataclass
class Shape:
    """The agent workload: session arrival rate, turns per session, tokens and think time."""

    session_rate: float = 20.0
    duration_s: float = 30.0
    turns: tuple[int, int] = (3, 8)
    system_tokens: int = 2048
    tool_tokens: tuple[int, int] = (100, 600)
    output_tokens: tuple[int, int] = (32, 128)
    think_s: float = 3.0
    tenants: int = 8
    seed: int = 0
    measure_from: float = 0.5  # share of duration_s after which requests count (the fleet fills up first)


@dataclass
class _Session:
    sid: str
    tenant: str
    turns: int
    context: list[int]
    turn: int = 0
    rng: random.Random = field(default_factory=random.Random)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


class Run:
    """One policy's run of one workload on one fleet: the callbacks Fleet.run drives, and the results."""

    def __init__(self, policy: str, shape: Shape, engines: list[str], block_size: int, prefill_s_per_token: float):
        self.shape, self.bs, self.names = shape, block_size, engines
        self.router = BatonRouter() if policy == "baton" else RoundRobin()
        self.translator = EventTranslator(block_size)
        self.prefill_s_per_block = prefill_s_per_token * block_size
        rng = random.Random(shape.seed)
        self.system = {f"t{i}": _tokens(rng, shape.system_tokens) for i in range(shape.tenants)}
        self.inflight = {n: 0 for n in engines}
        self.queued = {n: 0.0 for n in engines}
        self.live: dict[str, _Session] = {}
        self.reqs: dict[str, dict] = {}
        self.oracle: set[int] = set()
        self.decide_s: list[float] = []
        self.tickets = itertools.count()
        self.peak_live = 0

    def arrivals(self) -> list[tuple[float, object]]:
        rng, t, out, i = random.Random(self.shape.seed + 1), 0.0, [], 0
        while True:
            t += rng.expovariate(self.shape.session_rate)
            if t > self.shape.duration_s:
                return out
            tenant = f"t{i % self.shape.tenants}"
            s = _Session(f"s{i}", tenant, rng.randint(*self.shape.turns), list(self.system[tenant]),
                         rng=random.Random(self.shape.seed * 1_000_003 + i))
            out.append((t, s))
            i += 1

    def on_arrival(self, s: _Session, now: float, fleet) -> tuple | None:
        s.turn += 1
        self.live[s.sid] = s
        self.peak_live = max(self.peak_live, len(self.live))
        prompt = s.context + _tokens(s.rng, s.rng.randint(*self.shape.tool_tokens))
        s.context = prompt
        return self.send(s, s.sid, s.turn, prompt, s.tenant, s.rng.randint(*self.shape.output_tokens), now, fleet)

    def send(self, s, sid: str | None, turn: int, prompt: list[int], tenant: str, max_tokens: int, now: float,
             fleet) -> tuple:
        """Routes one request of session `sid` (its `turn`) and records it; what Fleet.run sends."""
        hashes = hash_blocks(prompt, self.bs, tenant)
        baton = isinstance(self.router, BatonRouter)
        # as a front places a session with no live pin: by live sessions per replica, a ticket
        # taking turns among the tied (deployments/front/request_routing.py `_read_placement`)
        new = baton and sid is not None and self.router.pins.peek(sid, now) is None
        loads = self._loads(fleet, self.router.pins if new else None)
        request, ticket = RoutingRequest(tuple(hashes), sid), next(self.tickets) if new else None
        t0 = time.perf_counter()
        d = self.router.route(request, loads, now, ticket) if baton else self.router.route(request, loads, now)
        self.decide_s.append(time.perf_counter() - t0)
        usable = (len(prompt) - 1) // self.bs  # vLLM always computes a prompt's last token
        predicted = min(d.cached_blocks, usable) * self.bs if baton else None
        oracle = 0
        for h in hashes[:usable]:
            if h not in self.oracle:
                break
            oracle += self.bs
        rid = f"r{len(self.reqs)}"
        self.reqs[rid] = {"session": s, "turn": turn, "arrival": now, "engine": d.replica, "prompt": len(prompt),
                          "predicted": predicted, "oracle": oracle, "hashes": hashes, "out": []}
        self.inflight[d.replica] += 1
        return d.replica, rid, prompt, max_tokens, tenant

    def _loads(self, fleet, pins=None) -> dict[str, ReplicaLoad]:
        """Each engine's load as a front reads it; with `pins`, its live sessions too."""
        out = {}
        for n in self.names:
            ld = fleet.engines[n].load()
            out[n] = ReplicaLoad(running=self.inflight[n], capacity=max(1, ld["kv_blocks"]),
                                 free_kv_blocks=ld["kv_empty_blocks"],
                                 queued_prefill_blocks=ld["queued_prefill_tokens"] / self.bs,
                                 prefill_s_per_block=self.prefill_s_per_block,
                                 sessions=pins.held(n) if pins is not None else 0)
        return out

    def on_output(self, engine: str, o, now: float) -> list:
        r = self.reqs[o.request_id]
        if "ttft" not in r:
            r["ttft"] = now - r["arrival"]
            r["cached"] = o.prefill_stats.num_cached_tokens if o.prefill_stats else 0
        r["out"].extend(o.new_token_ids)
        if o.finish_reason is None:
            return []
        self.inflight[engine] -= 1
        return self.finished(r, now)

    def finished(self, r: dict, now: float) -> list:
        """Records a finished request `r`; returns its session's next arrival, if any."""
        s = r["session"]
        s.context = s.context + r["out"]
        full = hash_blocks(s.context, self.bs, s.tenant)
        self.oracle.update(full)  # an unbounded cache keeps prompt and answer blocks
        r.pop("hashes")
        if s.turn >= s.turns:
            self.live.pop(s.sid, None)
            return []
        return [(now + s.rng.expovariate(1 / self.shape.think_s), s)]

    def on_events(self, engine: str, events, now: float) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for ev in events:
            if isinstance(ev, BlockStored):
                t = self.translator.stored(engine, ev.block_hashes, ev.parent_block_hash, ev.token_ids,
                                           ev.extra_keys)
                if t is not None and isinstance(self.router, BatonRouter):
                    self.router.on_kv_stored(engine, t.hashes, t.parent)
            elif isinstance(ev, BlockRemoved):
                gone = self.translator.removed(engine, ev.block_hashes)
                if isinstance(self.router, BatonRouter):
                    self.router.on_kv_removed(engine, gone)
            elif isinstance(ev, AllBlocksCleared):
                self.translator.cleared(engine)

    def summary(self) -> dict:
        """Over the requests that arrived in the measured window (from `measure_from` of the run to its
        end), each policy's same requests: all of them got a first token before the fleet stopped."""
        start = self.shape.measure_from * self.shape.duration_s
        window = [r for r in self.reqs.values() if start <= r["arrival"] <= self.shape.duration_s]
        done = [r for r in window if "ttft" in r]
        first = [r["ttft"] for r in done if r["turn"] == 1]
        later = [r["ttft"] for r in done if r["turn"] > 1]
        prompt = sum(r["prompt"] for r in done)
        cached = sum(r["cached"] for r in done)
        oracle = sum(r["oracle"] for r in done)
        pred = [r for r in done if r["predicted"] is not None]
        exact = sum(r["predicted"] == r["cached"] for r in pred)

        def ms(v, q):
            x = percentile(v, q)
            return None if x is None else round(x * 1000, 2)

        return {"requests": len(done), "unanswered": len(window) - len(done),
                "turn1_ttft_p50_ms": ms(first, 50), "turn1_ttft_p99_ms": ms(first, 99),
                "later_ttft_p50_ms": ms(later, 50), "later_ttft_p99_ms": ms(later, 99),
                "cached_share": round(cached / prompt, 4) if prompt else None,
                "oracle_share": round(oracle / prompt, 4) if prompt else None,
                "cached_vs_oracle": round(cached / oracle, 4) if oracle else None,
                "predicted_exact": round(exact / len(pred), 4) if pred else None,
                "peak_live_sessions": self.peak_live,
                "decision_p50_ms": ms(self.decide_s, 50), "decision_p99_ms": ms(self.decide_s, 99)}


def run_policy(fleet, policy: str, shape: Shape, profile: str, progress=None, kind: type = None) -> dict:
    """One policy's run of `shape` on a fresh `fleet` (its engines' caches empty, its clock at 0), by
    a `kind` of Run (this module's sessions, or bench/scale/scale_trace.py's trace)."""
    prof = GpuProfile.load(profile)
    run = (kind or Run)(policy, shape, sorted(fleet.engines, key=lambda n: int(n[1:])), prof.block_size,
                        prof.prefill_s(0, 2048) / 2048)
    t0 = time.perf_counter()
    def show(now: float) -> None:
        if progress:
            progress(f"{policy}: {now:.1f} virtual s, {len(run.reqs)} requests, {len(run.live)} live sessions")

    fleet.run(run.arrivals(), lambda s, now: run.on_arrival(s, now, fleet), run.on_output, run.on_events,
              until=shape.duration_s + 30, progress=show)
    out = run.summary()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["virtual_s"] = round(fleet.clock.now, 1)
    return out


def compare(replicas: int, shape: Shape, model: str, profile: str, order: list[str], progress,
            kind: type = None) -> dict:
    """Each policy in `order` on a fleet of its own, same workload; TTFT ratios of Baton to round robin."""
    import gc

    from bench.scale.scale_fleet import Fleet

    out: dict = {"replicas": replicas}
    for policy in order:
        fleet = Fleet(replicas, model, profile, max_model_len=MAX_MODEL_LEN,
                      progress=lambda i, n: progress(f"{policy}: engine {i}/{n} built"))
        progress(f"{policy}: running {shape.duration_s:.0f} virtual s of sessions on {replicas} engines")
        out[policy] = run_policy(fleet, policy, shape, profile, progress, kind)
        progress(f"{policy}: {out[policy]}")
        fleet.shutdown()
        del fleet
        gc.collect()
    b, rr = out.get("baton"), out.get("round_robin")
    if b and rr:
        out["ratios"] = {k: round(b[k] / rr[k], 3) for k in ("turn1_ttft_p50_ms", "later_ttft_p50_ms",
                                                               "later_ttft_p99_ms") if b[k] and rr[k]}
    return out
