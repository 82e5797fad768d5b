"""Many models on one replica (issue 32): a catalogue of three, room for two.

One colocated replica serves the default model and two catalogue models
(cluster/default_model/tiny_model.py sizes); `catalogue.memory_gb` holds two of the three,
so a request for the third wakes it and evicts the least wanted. The stack is
started once for the module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from common.constants import REPO_ROOT
from deployments.api.api_keys import hash_key
from tests.e2e import prompts

KEY_A, KEY_B = "models-key-a", "models-key-b"
SMALL, DEEP, FIRST = "baton-small", "baton-deep", "baton-tiny"
MIN_RESIDENT_S = 2
PROBE = "baton_probe"
ENVS = {"baton-env-1": "1.0", "baton-env-2": "2.0"}  # model -> the probe package version of its environment
PROBE_DRIVER = """
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
[name] = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
          if a["name"].startswith("baton-model:") and a["name"].endswith(":" + sys.argv[2])]
print("PROBE " + json.dumps(ray.get(ray.get_actor(name, namespace="baton").probe.remote(sys.argv[3]))))
"""


@pytest.fixture(scope="module")
def catalogue_stack(tmp_path_factory):
    from bench.common.stack import StackProcess, write_config

    cfg = yaml.safe_load((REPO_ROOT / "cluster" / "catalogue.yaml").read_text())
    models = [m for m in cfg["models"] if m["id"] in (SMALL, DEEP)]
    # Two more, each in its own Ray runtime_env whose py_modules carry another version of one package.
    workdir = tmp_path_factory.mktemp("models")
    for env, version in ENVS.items():
        package = workdir / env / PROBE
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
        models.append({"id": env, "path": str(REPO_ROOT / "models" / "catalogue" / "baton-medium"),
                       "runtime_env": {"py_modules": [str(package)]}})
    # Five models of about 0.26 GiB each (0.25 GiB KV cache plus weights): two fit.
    s = StackProcess(write_config(
        workdir, colocated=True, decode={"replicas": 1, "kv_cache_gb": 0.25},
        models=models, catalogue={"memory_gb": 0.6, "min_resident_s": MIN_RESIDENT_S},
        serve={"api_keys": {hash_key(KEY_A): "tenant-a", hash_key(KEY_B): "tenant-b"}}))
    s.start()
    yield s
    assert s.stop() == 0, s.tail()


def _client(stack, key: str = KEY_A) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {key}"}, timeout=120)


def _chat(stack, model: str, name: str = "short", key: str = KEY_A, headers: dict | None = None) -> httpx.Response:
    body = {"model": model, "messages": prompts.cases("plain")[name], "max_tokens": prompts.MAX_TOKENS,
            "temperature": 0, "return_token_ids": True}
    with _client(stack, key) as c:
        return c.post("/v1/chat/completions", json=body, headers=headers or {})


def _listing(stack) -> dict[str, dict]:
    with _client(stack) as c:
        r = c.get("/v1/models")
    assert r.status_code == 200, r.text
    return {m["id"]: m["baton"] for m in r.json()["data"]}


def _make_resident(stack, model: str, retry: tuple[int, ...] = (429, 503)) -> None:
    """Asks for `model` until it answers (its wake may wait out another's minimum residence); the
    statuses in `retry` are retried after their Retry-After (else 1 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = _chat(stack, model)
        if r.status_code == 200:
            return
        assert r.status_code in retry, r.text  # waking, or a start that failed (retried)
        time.sleep(float(r.headers.get("retry-after", 1)))
    raise AssertionError(f"{model} did not become resident")


def test_models_lists_the_catalogue_and_what_is_resident(catalogue_stack):
    listing = _listing(catalogue_stack)
    assert set(listing) == {FIRST, SMALL, DEEP, *ENVS}
    assert listing[FIRST]["resident"] and sum(m["resident"] for m in listing.values()) <= 2


def test_unknown_model_is_a_404_naming_only_the_id_sent(catalogue_stack):
    r = _chat(catalogue_stack, "no-such-model")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and "'no-such-model'" in err["message"]
    assert SMALL not in err["message"] and FIRST not in err["message"]


def test_a_wake_that_cannot_meet_the_deadline_is_a_429_with_retry_after(catalogue_stack):
    _make_resident(catalogue_stack, SMALL)
    _make_resident(catalogue_stack, FIRST)  # DEEP is cold now: two of three fit
    r = _chat(catalogue_stack, DEEP, headers={"x-baton-deadline-s": "0.2"})
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "model_loading" and int(r.headers["retry-after"]) >= 1
    deadline = time.monotonic() + 60  # it wakes anyway, for the retry Retry-After asks for
    while not _listing(catalogue_stack)[DEEP]["resident"]:
        assert time.monotonic() < deadline, "the refused request's model did not wake"
        time.sleep(0.25)


def test_a_cold_model_wakes_and_answers_as_vllm_serve_does(catalogue_stack, reference):
    """The stacks' model, evicted (the other two resident: room for two) and woken again, gives
    `vllm serve`'s greedy tokens (the e2e `reference`, taken once for every stack)."""
    _make_resident(catalogue_stack, SMALL)
    _make_resident(catalogue_stack, DEEP)
    assert not _listing(catalogue_stack)[FIRST]["resident"]
    _make_resident(catalogue_stack, FIRST)
    for name in prompts.LENGTHS:
        r = _chat(catalogue_stack, FIRST, name)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == reference[f"plain/{name}"]["token_ids"]
    assert _listing(catalogue_stack)[FIRST]["resident"]


def test_an_evicted_model_frees_its_memory(catalogue_stack):
    _make_resident(catalogue_stack, SMALL)
    _make_resident(catalogue_stack, FIRST)
    before = _listing(catalogue_stack)
    assert not before[DEEP]["resident"]
    assert all(_rss(before[m]["pids"]) > 50 * 2**20 for m in (SMALL, FIRST))
    time.sleep(MIN_RESIDENT_S)
    _make_resident(catalogue_stack, DEEP)  # room for two: the least wanted of the others goes
    after = _listing(catalogue_stack)
    (evicted,) = [m for m in (SMALL, FIRST) if not after[m]["resident"]]
    assert _rss(before[evicted]["pids"]) == 0  # its engine processes are gone
    assert _rss(after[DEEP]["pids"]) > 50 * 2**20


def test_a_dead_model_engine_is_woken_again_by_its_next_request(catalogue_stack):
    _make_resident(catalogue_stack, DEEP)
    for pid in _listing(catalogue_stack)[DEEP]["pids"]:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:  # the first requests may see the dying engine; none hangs, and it comes back
        r = _chat(catalogue_stack, DEEP)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        assert r.status_code in (429, 503), r.text  # a dead engine is a 503 (actors/openai_app.py)
        time.sleep(float(r.headers.get("retry-after", 1)))
    assert r.status_code == 200, r.text


def test_models_in_their_own_runtime_env_each_see_their_own_package_version(catalogue_stack):
    for model, version in ENVS.items():
        _make_resident(catalogue_stack, model)
        out = catalogue_stack.driver(PROBE_DRIVER, model, PROBE, timeout=120)
        probe = json.loads(next(x for x in out.splitlines() if x.startswith("PROBE ")).split(" ", 1)[1])
        assert probe["version"] == version, probe
        pids = _listing(catalogue_stack)[model]["pids"]
        assert pids and _rss(pids) > 50 * 2**20  # the model's own engine processes
    with pytest.raises(ImportError):  # the base environment (the replica's) has no such package
        __import__(PROBE)


def test_a_swap_that_meets_a_death_leaves_no_request_hanging_and_the_catalogue_consistent(catalogue_stack):
    import psutil

    _make_resident(catalogue_stack, FIRST)
    listing = _listing(catalogue_stack)
    standby = psutil.Process(listing[FIRST]["pids"][0]).ppid()  # the engines' forkserver (actors/fast_start.py)
    cold = next(m for m in (SMALL, DEEP) if not listing[m]["resident"])
    time.sleep(MIN_RESIDENT_S)
    with ThreadPoolExecutor(1) as pool:
        waking = pool.submit(_chat, catalogue_stack, cold)
        time.sleep(0.5)  # its wake has begun: the standby dies, and every engine forked from it
        os.kill(standby, signal.SIGKILL)
        answer = waking.result(timeout=120)  # an answer, not a hang
    assert answer.status_code in (200, 429, 503), answer.text
    for model in (cold, FIRST):  # the standby comes back with the next wake; each model answers again
        _make_resident(catalogue_stack, model, retry=(429, 503))  # 503: a request meeting a dying engine
    listing = _listing(catalogue_stack)
    assert listing[cold]["resident"] and listing[FIRST]["resident"]
    assert sum(m["resident"] for m in listing.values()) == 2  # room for two, as the catalogue counts


def test_the_chaos_benchs_swap_fault_meets_a_waking_engine_and_the_model_comes_back(catalogue_stack):
    """`baton bench chaos --layout catalogue`'s fault (bench/chaos/swap.py) on this stack, without
    its traffic: it kills the engine a swap forks; the request that started the wake is answered
    (its model started again within its deadline), and a later request finds the model resident."""
    from bench.chaos.swap import SwapFault

    fault = SwapFault(catalogue_stack, FIRST, deadline_s=60)
    assert fault.resident == SMALL and ENVS.keys().isdisjoint(fault.models)  # their engines are Ray actors
    _make_resident(catalogue_stack, FIRST)
    fault.prepare()  # SMALL resident beside FIRST: the memory is full
    _make_resident(catalogue_stack, FIRST)  # in case SMALL's wake evicted it
    time.sleep(MIN_RESIDENT_S)  # whichever catalogue model is cold now, its wake may evict
    victim = fault.inject()
    assert fault.killed, victim
    deadline = time.monotonic() + 120
    while not fault.recovered():
        assert time.monotonic() < deadline, fault.report()
        time.sleep(0.5)
    r = fault.report()
    assert r["swap_request"] == "ok", r  # the crashed start was tried again within its deadline (START_RETRIES)
    assert r["swap_requests"]["hung"] == r["swap_requests"]["unclean_error"] == 0, r
    assert _listing(catalogue_stack)[fault.cold]["resident"]


def test_usage_counters_equal_the_clients_usage_per_tenant_and_model(catalogue_stack):
    _make_resident(catalogue_stack, FIRST)
    _make_resident(catalogue_stack, SMALL)
    before = _usage(catalogue_stack)
    sent: dict[tuple, int] = {}
    for key, tenant in ((KEY_A, "tenant-a"), (KEY_B, "tenant-b")):
        for model in (FIRST, SMALL):
            for name in ("short", "medium"):
                usage = _chat(catalogue_stack, model, name, key=key).json()["usage"]
                for kind, n in (("prompt", usage["prompt_tokens"]), ("completion", usage["completion_tokens"]),
                                ("cached", usage["prompt_tokens_details"]["cached_tokens"])):
                    sent[(tenant, model, kind)] = sent.get((tenant, model, kind), 0) + n
    after = _usage(catalogue_stack)
    assert {k: after.get(k, 0) - before.get(k, 0) for k in sent} == sent


def _usage(stack) -> dict[tuple, int]:
    """baton_usage_tokens_total by (tenant, model, kind), from the pool's /metrics."""
    return {(k["tenant"], k["model"], k["kind"]): v for k, v in _samples(stack, "baton_usage_tokens_total")}


def _samples(stack, name: str) -> list[tuple[dict, int]]:
    """The pool's /metrics samples of `name`: (labels, value)."""
    with _client(stack) as c:
        text = c.get("/metrics").text
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
            out.append((labels, int(float(line.rsplit(" ", 1)[1]))))
    return out


def _rss(pids: list[int]) -> int:
    """Resident bytes of those of `pids` still alive."""
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def _nice(pids: list[int]) -> set[int]:
    """The priorities of every thread of `pids`."""
    import psutil

    out = set()
    for pid in pids:
        for thread in psutil.Process(pid).threads():
            out.add(os.getpriority(os.PRIO_PROCESS, thread.id))
    return out


def test_a_cold_models_engine_serves_below_the_hot_models(catalogue_stack):
    """catalogue.cold_nice (10): the engine of a resident model outside the hot set (room for two:
    the one model asked most) runs 10 nice steps below the hot model's."""
    _make_resident(catalogue_stack, FIRST)
    for _ in range(30):  # FIRST the most wanted of the five
        assert _chat(catalogue_stack, FIRST).status_code == 200
    listing = _listing(catalogue_stack)
    cold = next(m for m in (SMALL, DEEP) if not listing[m]["resident"])
    _make_resident(catalogue_stack, cold)  # asked once or twice: not hot
    time.sleep(1.1)  # the host ranks the engines at most once a second, and at each wake
    assert _chat(catalogue_stack, FIRST).status_code == 200
    listing = _listing(catalogue_stack)
    hot = _nice(listing[FIRST]["pids"])
    assert len(hot) == 1, hot
    assert _nice(listing[cold]["pids"]) == {min(19, next(iter(hot)) + 10)}


def test_a_replica_keeps_serving_its_resident_models_while_another_wakes(catalogue_stack):
    """A wake starts an engine (seconds); the replica's loop must not wait on it: the resident
    model's requests sent meanwhile keep being answered, never held back for the whole start."""
    _make_resident(catalogue_stack, FIRST)
    cold = next(m for m, e in _listing(catalogue_stack).items() if not e["resident"] and m in (SMALL, DEEP))
    time.sleep(MIN_RESIDENT_S)  # the wake need not wait out a minimum residence
    answered, stop = [], False

    def poll():
        with _client(catalogue_stack) as c:
            while not stop:
                r = c.post("/v1/chat/completions", json={"model": FIRST, "max_tokens": 2, "messages": [
                    {"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
                answered.append(time.monotonic())

    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(poll)
        time.sleep(0.5)
        t0 = time.monotonic()
        r = _chat(catalogue_stack, cold)
        took = time.monotonic() - t0
        stop = True
        polling.result()
    assert r.status_code == 200, r.text
    during = [t0, *[t for t in answered if t0 < t < t0 + took], t0 + took]
    gap = max(b - a for a, b in zip(during, during[1:]))
    assert gap < 0.5 * took, f"the resident model went unanswered for {gap:.2f} s of a {took:.2f} s wake"
