"""Secure by default, on the shared stack: loopback-only listeners, run-time API
keys, size limits, and no keys or prompt text in logs, /metrics or status."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import httpx

from common.constants import REPO_ROOT as REPO
from common.listeners import exposed, listeners
from deployments.api.api_keys import hash_key
from tests.e2e.conftest import KEY_A, KEY_B

BATON = str(REPO / ".venv" / "bin" / "baton")
CANARY = f"canary-prompt-{uuid.uuid4().hex}"
ISSUED: list[str] = []  # keys this module issued, looked for in the logs at the end


def _chat(stack, key: str | None, content: str = "hello", **extra) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{stack.url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "baton-tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra})


def test_every_listener_of_the_stack_is_on_loopback(stack):
    found = listeners([stack.proc.pid])
    # Ray, Redis, Mooncake, the engines and the public port are all in the tree.
    assert len(found) > 10, [str(x) for x in found]
    assert any(x.port == stack.cfg["serve"]["port"] for x in found)
    assert exposed([stack.proc.pid]) == [], "\n".join(str(x) for x in exposed([stack.proc.pid]))


def test_keys_added_and_revoked_at_run_time(stack):
    def keys(*args):
        out = subprocess.run([BATON, "--config", str(stack.config), "keys", *args], capture_output=True,
                             text=True, timeout=60, cwd=REPO)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    key = keys("add", "tenant-run-time")
    ISSUED.append(key)
    assert key not in keys("list") and hash_key(key)[:19] in keys("list")
    deadline = time.monotonic() + 5
    while (r := _chat(stack, key)).status_code == 401 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    keys("revoke", key)
    revoked = time.monotonic()
    while (r := _chat(stack, key)).status_code == 200:
        assert time.monotonic() - revoked < 5, "a revoked key still works after 5 s"
        time.sleep(0.2)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert _chat(stack, KEY_A).status_code == 200  # the config's keys are untouched


def test_oversized_inputs_get_4xx_and_the_server_keeps_serving(stack):
    big = b'{"model": "baton-tiny", "messages": [{"role": "user", "content": "' + b"a" * (50 * 2**20) + b'"}]}'
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=big, timeout=120,
                   headers={"content-type": "application/json", "authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    many = [{"role": "user", "content": "x"}] * 5000
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=60, headers={"authorization": f"Bearer {KEY_A}"},
                   json={"model": "baton-tiny", "messages": many})
    assert r.status_code == 400 and "messages" in r.text
    assert _chat(stack, KEY_A, n=1000).status_code == 400
    assert _chat(stack, KEY_A, max_tokens=10**9).status_code == 400
    assert _chat(stack, KEY_A).status_code == 200


def _log_files(stack) -> list[Path]:
    state = stack.state()
    roots = [Path(stack.cfg["state_dir"]), Path(state["ray_session_dir"]) / "logs"]
    traces = Path(stack.cfg["tracing"]["file"])
    files = [stack.log, traces] + [p for root in roots for p in root.rglob("*") if p.is_file()]
    return [p for p in files if p.exists() and not p.is_socket()]


def test_no_key_or_prompt_text_in_logs_metrics_or_status(stack):
    assert _chat(stack, KEY_B, content=f"please remember {CANARY}").status_code == 200
    time.sleep(2)  # Ray forwards workers' logs in batches
    secrets = [KEY_A, KEY_B, CANARY, *ISSUED]
    metrics = httpx.get(f"{stack.url}/metrics", timeout=30).text
    status = stack.baton("status", "--json").stdout
    for name, text in (("/metrics", metrics), ("baton status", status)):
        assert not [s for s in secrets if s in text], name
    leaks = []
    for path in _log_files(stack):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        leaks += [f"{path}: {s[:12]}..." for s in secrets if s.encode() in data]
    assert leaks == []


def test_behind_haproxy_every_listener_is_on_loopback_too(colocated_stack):
    """The colocated stack runs `baton up`'s default ingress: HAProxy holds the public port, and
    the fronts behind it listen on loopback as everything else does."""
    children = colocated_stack.state()["children"]
    haproxy = listeners([pid for name, pid in children.items() if name.startswith("ingress-haproxy")])
    assert [x.port for x in haproxy] == [colocated_stack.cfg["serve"]["port"]] * 2, [str(x) for x in haproxy]
    assert exposed([colocated_stack.proc.pid]) == [], "\n".join(str(x) for x in exposed([colocated_stack.proc.pid]))
