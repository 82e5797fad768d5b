"""The KV indexer restarts while the engines keep publishing: the new one resumes
from the state the old one saved with the index (each engine's next batch and
its block map), takes the batches published meanwhile, queued by the engines'
publishers or replayed from their buffers, and predictions stay exact.

It damages the shared stack (the `destructive` fixture): it runs after every test that keeps it whole.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from tests.e2e import prompts
from tests.e2e.test_routing import EVENTS_SETTLE_S, chat, engine_hit

STATS = """
import json, sys
import ray
from ray import serve
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
         if a["name"].startswith("SERVE_REPLICA::baton#kv_indexer#")]
stats = serve.get_deployment_handle("kv_indexer", app_name="baton").stats.remote().result()
print("INDEXER " + json.dumps({"actors": names, "stats": stats}))
"""

pytestmark = pytest.mark.usefixtures("destructive")


def _indexer(stack) -> dict:
    out = stack.driver(STATS, timeout=120)
    return json.loads(next(x for x in out.splitlines() if x.startswith("INDEXER ")).split(" ", 1)[1])


def test_a_restarted_indexer_resumes_and_misses_nothing(stack):
    chat(stack, prompts.make("indexer-before", 60))  # batches the old indexer applies
    time.sleep(EVENTS_SETTLE_S)
    before = _indexer(stack)
    assert sum(before["stats"]["next_seq"].values()) > 0, before
    assert len(before["actors"]) == 1, before
    old = stack.indexer_pid()
    assert old is not None, "no KV indexer listens on the events port"
    os.kill(old, signal.SIGKILL)  # as a crash: Serve sees its replica die and starts another
    # Meanwhile the engines go on publishing: these blocks reach no indexer.
    conversation = prompts.make("indexer-restart", 120)
    chat(stack, conversation, session="sess-indexer")
    deadline = time.monotonic() + 120
    while stack.indexer_pid() in (None, old):  # the new one binds the events port as it starts
        assert time.monotonic() < deadline, "no new KV indexer within 120 s"
        time.sleep(0.2)
    after = _indexer(stack)  # its stats call waits until the new replica is ready
    assert after["actors"] and after["actors"] != before["actors"], (before["actors"], after["actors"])
    # It took over every engine the old one knew, at the old one's next batch...
    assert set(after["stats"]["resumed"]) >= set(before["stats"]["next_seq"]), (before["stats"], after["stats"])
    # ...and hears from an engine when it next publishes.
    deadline = time.monotonic() + 60
    while not after["stats"]["applied"]:
        chat(stack, prompts.make("indexer-nudge", 40))
        assert time.monotonic() < deadline, after
        time.sleep(0.5)
        after = _indexer(stack)
    assert not after["stats"]["resyncs"], after["stats"]
    # What was published while no indexer ran is in the index: the prefix is predicted exactly.
    time.sleep(EVENTS_SETTLE_S)
    baton = chat(stack, conversation + [{"role": "user", "content": "and one more"}], session="sess-indexer").json()
    baton = baton["baton"]
    assert engine_hit(baton) > 0 and baton["predicted_cached_tokens"] == engine_hit(baton), baton


def test_index_counters_are_in_metrics_and_status(stack):
    """Runs after the restart above: the takeover it caused is counted where operators look."""
    metrics = {}
    for line in httpx.get(f"{stack.url}/metrics", timeout=30).text.splitlines():
        if line.startswith(("baton_indexer_", "baton_index_")):
            name, value = line.rsplit(" ", 1)
            metrics[name] = float(value)
    assert metrics["baton_indexer_resumed_total"] > 0 and "baton_indexer_replayed_batches_total" in metrics
    assert metrics["baton_indexer_applied_events_total"] > 0 and "baton_indexer_resyncs_total" in metrics
    exact = metrics['baton_index_predictions_total{outcome="exact"}']
    inexact = metrics['baton_index_predictions_total{outcome="over"}'] + \
        metrics['baton_index_predictions_total{outcome="under"}']
    assert exact > 0 and exact >= 0.9 * (exact + inexact), metrics
    assert metrics["baton_index_actual_cached_tokens_total"] > 0
    status = json.loads(stack.baton("status", "--json").stdout)
    [indexer] = [c for c in status["components"] if c["name"] == "kv-indexer"]
    assert indexer["state"] == "healthy" and "resumed" in indexer["detail"], indexer
