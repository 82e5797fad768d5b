"""A system prompt of many blocks that many sessions share becomes a shared head, on real engines.

On the colocated stack (two routed replicas): each block of the system prompt has one child in
the index but the last, which every conversation continues its own way. While fewer than
SHARED_FANOUT conversations have continued it, a new session goes where the prompt is cached
(route "prefix"); from then on the prompt is credited to both replicas (routing/policy/policy.py,
step 3), so new sessions are placed by load and sessions pinned, not drawn to its first holder
(route "load"). The index predicts what the chosen engine finds cached, either way.
"""

from __future__ import annotations

import time

from routing.policy.policy import PolicyConfig
from tests.e2e import prompts
from tests.e2e.conftest import KEY_A
from tests.e2e.test_routing import EVENTS_SETTLE_S, chat

SHARED_FANOUT = PolicyConfig().shared_fanout


def _question(n: int) -> str:
    """A question of its own, longer than a block, so each conversation stores a block after the prompt."""
    return f"Question {n}: " + " ".join(prompts.CORPUS[(n * 37 + i) % len(prompts.CORPUS)] for i in range(60))


def test_a_long_system_prompt_continued_by_many_sessions_is_credited_to_every_replica(colocated_stack):
    system = {"role": "system", "content": "Shared head. " + " ".join(prompts.CORPUS[:300])}
    seen = []
    for n in range(SHARED_FANOUT + 2):
        if n in (1, SHARED_FANOUT):  # the prompt, then its eighth continuation, reached the index
            time.sleep(EVENTS_SETTLE_S)
        messages = [system, {"role": "user", "content": _question(n)}]
        baton = chat(colocated_stack, messages, key=KEY_A, session=f"shared-head-{n}", max_tokens=1).json()["baton"]
        seen.append((baton["route"], baton["decode_replica"], baton["predicted_cached_tokens"],
                     baton["decode_cached_tokens"]))
    holder = seen[0][1]
    assert all(s[:2] == ("prefix", holder) and s[3] > 0 for s in seen[1:SHARED_FANOUT]), seen
    assert all(s[0] == "load" for s in seen[SHARED_FANOUT:]), seen
    assert all(s[2] == s[3] for s in seen), seen  # predicted == what the engine found
