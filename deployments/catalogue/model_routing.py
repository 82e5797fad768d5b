"""Which replica runs a catalogue request (deployments/catalogue/model_host.py): session and prefix affinity within a model.

A catalogue stack's fronts are unrouted (the kernel spreads connections over
the replicas), and each replica keeps engines for the models resident there.
A request runs where its model is resident, in this order:
1. its session's replica for this model (`x-session-affinity`; the pin in
   Redis, `pin:model:<model>:<session>`, with `routing.pin_ttl_s`), while that
   replica's heartbeat lists the model resident: its KV cache holds the
   conversation's prefix (each model's engine has its own cache, salted per
   tenant), so a turn that lands on another front is sent back there.
   A request without the header goes to the replica that last ran the longest
   prefix of its prompt (`prefix_keys`: chained hashes of its tenant and its
   prompt, block by block), so a conversation's later turns, and other
   conversations that open the same way (a shared system prompt, few-shot
   examples), reuse the cache that holds it. It follows that replica only
   while it has at most BALANCE_REQUESTS more requests unfinished than the
   least busy one with the model: a shared system prompt and first question
   from many clients must not all pile onto one replica;
2. this replica, when the model is resident here;
3. the least busy other replica whose heartbeat lists it resident;
4. this replica, woken (the front's `_model_app`).
The session, or each block of the prompt, is pinned to the choice. A Redis
error costs the pins, never the request.

The prefix index is approximate (as llm-d's approximate prefix scorer): it
records where prompts were sent, not what each engine's cache still holds, and
its blocks are characters of the request's messages, not tokens, so a front
needs no tokenizer for a model it may not have loaded.
"""

from __future__ import annotations

import hashlib
import json

import redis

from deployments.front.request_routing import Route
from routing.prefix.redis_state import pin_key


# How many more unfinished requests a sessionless prompt's replica may have than the least busy
# replica with its model before the prompt goes there instead (SGLang's cache-aware router has the
# same kind of absolute balance threshold).
BALANCE_REQUESTS = 4
BLOCK_CHARS = 512  # characters of a prompt per prefix block
MAX_BLOCKS = 64  # blocks looked up and recorded per request (the first 32k characters)


def prompt_text(body: dict) -> str:
    """The request's prompt as text that only grows as a conversation goes on: each chat message
    serialised on its own line (so appending turns appends text), or a completion's prompt."""
    messages = body.get("messages")
    if messages is None and "input" in body:  # a Responses request: its input items
        messages = [{"role": "user", "content": body["input"]}] if isinstance(body["input"], str) else body["input"]
    if isinstance(messages, list):
        return _lines(messages)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)


def _lines(messages: list) -> str:
    return "".join(json.dumps(m, sort_keys=True, default=str) + "\n" for m in messages)


def _opening(body: dict) -> int | None:
    """Length in `prompt_text` of a chat's opening: its messages up to the first user message's
    end, which every later turn resends unchanged; None for a completion."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return len(_lines(messages[:i + 1]))
    return len(_lines(messages))


def prefix_keys(tenant: str, body: dict) -> list[str]:
    """Keys of the prompt's prefixes, shortest first, for this tenant alone: one at the end of
    each full block of BLOCK_CHARS characters (the first MAX_BLOCKS), one at the end of a chat's
    opening (so a short conversation's later turns match its first), and one for the whole
    prompt (an exact repeat). Each is a hash chained over the prefix it ends."""
    text = prompt_text(body)[:BLOCK_CHARS * MAX_BLOCKS]
    ends = set(range(BLOCK_CHARS, len(text) + 1, BLOCK_CHARS)) | {len(text)}
    opening = _opening(body)
    if opening is not None and opening < len(text):
        ends.add(opening)
    keys, h, start = [], hashlib.sha256(f"{tenant}\0".encode()), 0
    for end in sorted(ends):
        h.update(text[start:end].encode())
        keys.append("pfx-" + h.copy().hexdigest()[:32])
        start = end
    return keys


class ModelRouting:
    """Chooses the replica for a catalogue request; reads the registry, reads and writes session pins."""

    def __init__(self, replica: str, peers, client, pin_ttl_s: float) -> None:
        self.replica, self.peers, self.redis, self.pin_ttl_s = replica, peers, client, pin_ttl_s

    async def peer(self, model: str, session: str | None, resident_here: bool,
                   prefixes: list[str] | None = None) -> Route | None:
        """The other replica that should run this request (route "model", "pinned" for its
        session's, "prefix" for the replica that ran the longest prefix of its prompt), or None
        to run it here. `prefixes`: `prefix_keys`, used when there is no `session`. Changes the
        pins (the session's, or each prefix block's: set or refreshed)."""
        entries = await self.peers()
        have = {r: e for r, e in entries.items() if "url" in e and model in e.get("resident", ())}
        pool = f"model:{model}"
        keys = [pin_key(pool, session)] if session else [pin_key(pool, k) for k in prefixes or ()]
        holders = await self._get_all(keys)
        pinned = holders[0] if session else next((r for r in reversed(holders) if r in have), None)
        if pinned in have and (session or self._balanced(pinned, have)):
            choice, reason = pinned, "pinned" if session else "prefix"
        elif resident_here:
            choice, reason = self.replica, "model"
        else:
            others = [(e.get("unfinished", 0), r) for r, e in have.items() if r != self.replica]
            choice, reason = (min(others)[1], "model") if others else (self.replica, "model")
        await self._set_all(keys, choice)
        if choice == self.replica:
            return None
        return Route(choice, None, True, reason, 0, decode_url=have[choice]["url"])

    @staticmethod
    def _balanced(pinned: str, have: dict) -> bool:
        """Whether `pinned` has at most BALANCE_REQUESTS more unfinished requests than the least
        busy replica in `have` (the replicas with the model resident, from their heartbeats)."""
        least = min(e.get("unfinished", 0) for e in have.values())
        return have[pinned].get("unfinished", 0) - least <= BALANCE_REQUESTS

    async def _get_all(self, keys: list[str]) -> list[str | None]:
        """The replica each key names (None where unset, or for all on a Redis error)."""
        if not keys or self.redis is None:
            return [None] * len(keys)
        try:
            raw = await self.redis.mget(keys)
        except redis.RedisError:
            return [None] * len(keys)
        return [r.decode() if isinstance(r, bytes) else r for r in raw]

    async def _set_all(self, keys: list[str], replica: str) -> None:
        if not keys or self.redis is None:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.set(key, replica, ex=max(1, int(self.pin_ttl_s)))
                await pipe.execute()
        except redis.RedisError:
            pass
