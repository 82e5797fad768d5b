"""The e2e stacks (Redis, Mooncake, Ray, vLLM), one `baton up` at a time.

Tests are ordered by the stacks their fixtures need (`pytest_collection_modifyitems`),
file order kept within each group:
1. the shared disaggregated stack (`stack`);
2. tests that damage it (the `destructive` fixture: replicas, the indexer or a
   Mooncake process killed), on the same stack, which no test uses after them;
3. the colocated stack (`colocated_stack`), the tests that damage it last;
4. tests with stacks of their own (catalogue, sites, the scale bench, ...).
Each shared stack starts with the first test that needs it and stops after the
last (`pytest_runtest_teardown`), so a stack never starts beside another.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from actors.vllm_plugin import FORK_ENV
from common.processes import pid_alive
from bench.common.stack import StackProcess, write_config
from deployments.api.api_keys import hash_key


PIN_TTL_S = 10
KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"
CAPACITY_PER_REPLICA = 2  # 2 decode replicas: 4 engine permits, so overload is cheap to make
_KEYS = {hash_key(KEY_A): "tenant-a", hash_key(KEY_B): "tenant-b"}


def _param(item, value: str) -> bool:
    spec = getattr(item, "callspec", None)
    return spec is not None and value in spec.params.values()


def _needs_shared(item) -> bool:
    return "stack" in item.fixturenames or _param(item, "disaggregated")


def _needs_colocated(item) -> bool:
    return "colocated_stack" in item.fixturenames or _param(item, "colocated")


def _group(item) -> int:
    damages = "destructive" in item.fixturenames
    if _needs_shared(item):
        return 1 if damages else 0
    if _needs_colocated(item):
        return 3 if damages else 2
    return 4


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_group)  # stable: file order within a group


def _start_shared(workdir: Path) -> StackProcess:
    """Launched only: `_get` waits for it to be ready."""
    s = StackProcess(write_config(
        workdir, decode={"replicas": 2},
        routing={"pin_ttl_s": PIN_TTL_S, "heartbeat_s": 1, "replica_timeout_s": 3},
        # direct: tests/e2e/test_replica_death.py needs client connections a replica's own front accepted
        serve={"api_keys": _KEYS, "engine_metrics": True, "ingress": "direct"},
        admission={"capacity_per_replica": CAPACITY_PER_REPLICA, "max_queue_per_tenant": 16},
    ))
    s.launch()
    return s


def _stop_shared(s: StackProcess) -> None:
    """Ctrl-C/SIGTERM must leave nothing behind: `up` exits 0 and every child it started (Redis,
    Mooncake master and store) is gone, including children it restarted since (state.json has
    their current PIDs)."""
    pids = _children(s)
    assert s.stop() == 0, s.tail()
    _gone(pids)


def _children(s: StackProcess) -> set[int]:
    """PIDs of every child `up` started, restarted ones included (state.json has the current ones)."""
    return set(s.children.values()) | set(s.state()["children"].values())


def _gone(pids: set[int], within_s: float = 5.0) -> None:
    """Every one of `pids` exits within `within_s` (stopped a moment ago; it was a fixed 1 s wait)."""
    deadline = time.monotonic() + within_s
    while (alive := [pid for pid in pids if pid_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == []


def _start_colocated(workdir: Path) -> StackProcess:
    """Baton colocated with two routed replicas (routing.colocated_router), keys required, behind
    HAProxy (serve.ingress auto, as every stack but the shared one)."""
    s = StackProcess(write_config(
        workdir, colocated=True, decode={"replicas": 2, "kv_cache_gb": 0.25},
        serve={"api_keys": _KEYS, "require_api_key": True},
        admission={"capacity_per_replica": CAPACITY_PER_REPLICA, "max_queue_per_tenant": 16}))
    s.start()
    return s


def _stop_colocated(s: StackProcess) -> None:
    """A stream that runs when the stack stops is answered to its end (through HAProxy), and no child
    of `up` is left behind. A stopping replica lets its HTTP requests finish before it stops its
    engine (deployments/replica.py DRAIN_S; before, Serve's fixed 2 s wait was all they got, and
    this stream ended with finish_reason "abort")."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=f"{s.url}/v1", api_key=KEY_A, max_retries=0, timeout=60)

    def chat(max_tokens: int, stream: bool = False):
        return client.chat.completions.create(
            model="baton-tiny", messages=[{"role": "user", "content": "count"}], stream=stream,
            max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})

    def finish_reason(max_tokens: int) -> str | None:
        reasons = [c.choices[0].finish_reason for c in chat(max_tokens, stream=True) if c.choices]
        return next((r for r in reversed(reasons) if r), None)

    took = {}
    for n in (32, 96):
        started = time.monotonic()
        chat(n)
        took[n] = time.monotonic() - started
    # About 4 s of decoding (the difference leaves the fixed costs out): longer than the 2 s Serve
    # waited before, shorter than DRAIN_S; within max_model_len.
    tokens = min(1800, max(64, int(4 * 64 / max(took[96] - took[32], 0.01))))
    pids = _children(s)  # HAProxy among them: it outlives the replicas' drain, then goes too
    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(finish_reason, tokens)
        time.sleep(0.3)
        assert s.stop() == 0, s.tail()
        assert streamed.result(60) == "length", tokens
    _gone(pids)


# name -> (whether a test needs it, start(workdir), stop(stack))
_KINDS = {"shared": (_needs_shared, _start_shared, _stop_shared),
          "colocated": (_needs_colocated, _start_colocated, _stop_colocated)}
_RUNNING: dict[str, StackProcess] = {}


def _launch(kind: str, tmp_path_factory) -> StackProcess:
    if kind not in _RUNNING:
        _RUNNING[kind] = _KINDS[kind][1](tmp_path_factory.mktemp(kind))
    return _RUNNING[kind]


def _get(kind: str, tmp_path_factory) -> StackProcess:
    s = _launch(kind, tmp_path_factory)
    s.ready()
    return s


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The shared disaggregated stack: 1 prefill and 2 decode replicas, two tenants' keys."""
    return _get("shared", tmp_path_factory)


@pytest.fixture(scope="session")
def colocated_stack(tmp_path_factory):
    """Baton colocated with two routed replicas (routing.colocated_router), keys required."""
    return _get("colocated", tmp_path_factory)


@pytest.fixture
def destructive():
    """Marks a test that damages its shared stack: it runs after every other test of that stack."""


def pytest_runtest_teardown(item, nextitem):
    later = item.session.items[item.session.items.index(item) + 1:]
    for kind in list(_RUNNING):
        needs = _KINDS[kind][0]
        if not any(needs(i) for i in later):
            _KINDS[kind][2](_RUNNING.pop(kind))


def pytest_sessionfinish(session, exitstatus):
    for kind in list(_RUNNING):
        _RUNNING.pop(kind).stop()


@pytest.fixture(scope="session")
def vllm_answers(request, tmp_path_factory):
    """What `vllm serve` answers on the stacks' model, taken once, its server stopped after:
    `agent`, each agent case's result (tests/e2e/agent_cases.py), and `tokens`, the greedy
    tokens of each prompt case (tests/e2e/prompts.py), as {"mode/name": {"prompt_ids", "token_ids"}}.
    Where the session needs the shared stack and has not started it, it is launched first, to
    start while this `vllm serve` answers (the e2e run waited 82 s for its first test, the two
    one after the other)."""
    if "shared" not in _RUNNING and any(_needs_shared(item) for item in request.session.items):
        _launch("shared", tmp_path_factory)
    import httpx
    from openai import OpenAI
    from transformers import AutoTokenizer

    from bench.common.peers import VllmServe
    from common.config import load_config
    from tests.e2e import prompts
    from tests.e2e.agent_cases import CASES

    workdir = tmp_path_factory.mktemp("vllm-serve")
    cfg = load_config(write_config(workdir))
    tok = AutoTokenizer.from_pretrained(str(cfg.model.resolved_path()))
    # one unbound thread, as the stacks' engines have on 2 cores, and a forked worker (a faster start)
    one_thread = {FORK_ENV: "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    with VllmServe(cfg, workdir / "vllm-serve.log", env=one_thread) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        agent = {case.__name__: case(client) for case in CASES}
        tokens = {}
        for mode in ("plain", "stream", "first"):
            for name, messages in prompts.cases(mode).items():
                text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                ids = tok.encode(text, add_special_tokens=False)
                r = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
                    "model": cfg.model.served_name, "prompt": ids, "max_tokens": prompts.MAX_TOKENS,
                    "temperature": 0, "return_token_ids": True})
                r.raise_for_status()
                tokens[f"{mode}/{name}"] = {"prompt_ids": ids, "token_ids": r.json()["choices"][0]["token_ids"]}
    return {"agent": agent, "tokens": tokens}


@pytest.fixture(scope="session")
def reference(vllm_answers):
    """Greedy tokens of `vllm serve` (a plain colocated vLLM engine) on the prompt cases."""
    return vllm_answers["tokens"]


@pytest.fixture(scope="session")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.url}/v1", api_key=KEY_A, max_retries=0, timeout=120)
