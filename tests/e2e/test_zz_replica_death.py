"""Runs last (file order): kills a decode replica; the session moves and the
pin follows. Serve replaces the replica afterwards."""

from __future__ import annotations

import time
import urllib.request

from tests.e2e import prompts
from tests.e2e.test_routing import chat


def test_session_moves_when_its_replica_dies(stack):
    """Runs last: it kills a decode replica (Serve replaces it afterwards)."""
    conversation = prompts.make("death", 60)
    victim = chat(stack, conversation, session="sess-death").json()["baton"]["decode_replica"]
    stack.kill_replica("decode", victim)
    time.sleep(stack.cfg["routing"]["replica_timeout_s"] + 1.5)  # heartbeat goes stale, pin (TTL 10 s) stays
    r = chat(stack, conversation, session="sess-death").json()["baton"]
    assert r["decode_replica"] != victim
    metrics = urllib.request.urlopen(f"{stack.url}/metrics", timeout=10).read().decode()
    assert 'baton_repins_total{pool="decode"} 0' not in metrics
