"""Which replica runs a catalogue request (deployments/model_host.py): session affinity within a model.

A catalogue stack's fronts are unrouted (the kernel spreads connections over
the replicas), and each replica keeps engines for the models resident there.
A request runs where its model is resident, in this order:
1. its session's replica for this model (`x-session-affinity`; the pin in
   Redis, `pin:model:<model>:<session>`, with `routing.pin_ttl_s`), while that
   replica's heartbeat lists the model resident: its KV cache holds the
   conversation's prefix (each model's engine has its own cache, salted per
   tenant), so a turn that lands on another front is sent back there;
2. this replica, when the model is resident here;
3. the least busy other replica whose heartbeat lists it resident;
4. this replica, woken (the front's `_model_app`).
The session is pinned to the choice. A Redis error costs the pin, never the
request.
"""

from __future__ import annotations

import redis

from deployments.request_routing import Route
from routing.redis_state import pin_key


class ModelRouting:
    """Chooses the replica for a catalogue request; reads the registry, reads and writes session pins."""

    def __init__(self, replica: str, peers, client, pin_ttl_s: float) -> None:
        self.replica, self.peers, self.redis, self.pin_ttl_s = replica, peers, client, pin_ttl_s

    async def peer(self, model: str, session: str | None, resident_here: bool) -> Route | None:
        """The other replica that should run this request (route "model", or "pinned" for its
        session's), or None to run it here. Changes the session's pin (set or refreshed)."""
        entries = await self.peers()
        have = {r: e for r, e in entries.items() if "url" in e and model in e.get("resident", ())}
        key = pin_key(f"model:{model}", session) if session else None
        pinned = await self._get(key)
        if pinned in have:
            choice, reason = pinned, "pinned"
        elif resident_here:
            choice, reason = self.replica, "model"
        else:
            others = [(e.get("unfinished", 0), r) for r, e in have.items() if r != self.replica]
            choice, reason = (min(others)[1], "model") if others else (self.replica, "model")
        if key is not None:
            await self._set(key, choice)
        if choice == self.replica:
            return None
        return Route(choice, None, True, reason, 0, decode_url=have[choice]["url"])

    async def _get(self, key: str | None) -> str | None:
        if key is None or self.redis is None:
            return None
        try:
            raw = await self.redis.get(key)
        except redis.RedisError:
            return None
        return raw.decode() if isinstance(raw, bytes) else raw

    async def _set(self, key: str, replica: str) -> None:
        if self.redis is None:
            return
        try:
            await self.redis.set(key, replica, ex=max(1, int(self.pin_ttl_s)))
        except redis.RedisError:
            pass
