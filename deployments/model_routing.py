"""Which replica runs a catalogue request (deployments/model_host.py): session affinity within a model.

A catalogue stack's fronts are unrouted (the kernel spreads connections over
the replicas), and each replica keeps engines for the models resident there.
A request runs where its model is resident, in this order:
1. its session's replica for this model (`x-session-affinity`; the pin in
   Redis, `pin:model:<model>:<session>`, with `routing.pin_ttl_s`), while that
   replica's heartbeat lists the model resident: its KV cache holds the
   conversation's prefix (each model's engine has its own cache, salted per
   tenant), so a turn that lands on another front is sent back there.
   A request without the header is pinned by its conversation instead
   (`conversation_key`: its tenant and its opening, which every later turn
   of a chat resends unchanged), and follows that pin only while the
   pinned replica has at most BALANCE_REQUESTS more requests unfinished
   than the least busy one with the model: a shared system prompt and first
   question from many clients must not all pile onto one replica;
2. this replica, when the model is resident here;
3. the least busy other replica whose heartbeat lists it resident;
4. this replica, woken (the front's `_model_app`).
The session is pinned to the choice. A Redis error costs the pin, never the
request.
"""

from __future__ import annotations

import hashlib
import json

import redis

from deployments.request_routing import Route
from routing.redis_state import pin_key


# How many more unfinished requests a sessionless conversation's replica may have than the least
# busy replica with its model before the conversation goes there instead (SGLang's cache-aware
# router has the same kind of absolute balance threshold).
BALANCE_REQUESTS = 4
OPENING_CHARS = 2048  # of a text prompt: what identifies a completion conversation


def conversation_key(tenant: str, body: dict) -> str:
    """A sessionless request's implicit session: a hash of its tenant and its opening (a chat's
    messages up to and including the first user message; a text prompt's first OPENING_CHARS
    characters). Later turns of the same conversation resend that opening, so they get the same key."""
    messages = body.get("messages")
    if isinstance(messages, list):
        opening = []
        for m in messages:
            opening.append(m)
            if isinstance(m, dict) and m.get("role") == "user":
                break
        text = json.dumps(opening, sort_keys=True, default=str)
    else:
        prompt = body.get("prompt")
        text = (prompt if isinstance(prompt, str) else json.dumps(prompt, default=str))[:OPENING_CHARS]
    return "conv-" + hashlib.sha256(f"{tenant}\0{text}".encode()).hexdigest()[:32]


class ModelRouting:
    """Chooses the replica for a catalogue request; reads the registry, reads and writes session pins."""

    def __init__(self, replica: str, peers, client, pin_ttl_s: float) -> None:
        self.replica, self.peers, self.redis, self.pin_ttl_s = replica, peers, client, pin_ttl_s

    async def peer(self, model: str, session: str | None, resident_here: bool,
                   conversation: str | None = None) -> Route | None:
        """The other replica that should run this request (route "model", "pinned" for its
        session's, "conversation" for a sessionless conversation's), or None to run it here.
        `conversation`: `conversation_key`, used when there is no `session`. Changes the pin
        (set or refreshed)."""
        entries = await self.peers()
        have = {r: e for r, e in entries.items() if "url" in e and model in e.get("resident", ())}
        key = pin_key(f"model:{model}", session or conversation) if session or conversation else None
        pinned = await self._get(key)
        if pinned in have and (session or self._balanced(pinned, have)):
            choice, reason = pinned, "pinned" if session else "conversation"
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

    @staticmethod
    def _balanced(pinned: str, have: dict) -> bool:
        """Whether `pinned` has at most BALANCE_REQUESTS more unfinished requests than the least
        busy replica in `have` (the replicas with the model resident, from their heartbeats)."""
        least = min(e.get("unfinished", 0) for e in have.values())
        return have[pinned].get("unfinished", 0) - least <= BALANCE_REQUESTS

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
