"""The catalogue's fault: a model engine killed while it wakes, in the middle of a swap.

On a catalogue stack (`baton bench chaos --layout catalogue`: one colocated
replica, the default model and two catalogue models, room for two) the
traffic goes to the default model. Before the traffic starts, `prepare` makes
the first catalogue model resident, so the memory is full. At the kill, a
request for a catalogue model that is not resident starts its wake, which
evicts another; as soon as the catalogue's standby (actors/fast_start.py) has
forked the waking engine, its processes are SIGKILLed, as a crash mid-start
would.

What must hold: the traffic on the serving model goes on unharmed; the
request that started the wake gets an answer (the catalogue starts the model
again within its deadline, deployments/catalogue/model_host.py) or a clean
error (no hang, no 5xx outside OpenAI's shape); and the model is back once a
later request finds it resident or wakes it again (`recovered`). The wake's requests are recorded as the
traffic's are (bench/chaos/outcomes.py), and reported with the fault.
"""

from __future__ import annotations

import threading
import time

import httpx

from bench.chaos.outcomes import counts
from bench.chaos.traffic import Traffic
from bench.common.stack import StackProcess

NAME = "model-swap"
FORK_WAIT_S = 30.0  # longest wait for the standby to fork the waking engine
MID_WAKE_S = 0.3  # how long into its start the engine is killed


def catalogue_models(stack: StackProcess) -> list[str]:
    """The catalogue's own models whose engines the replica's standby forks (the served default
    model not included, nor a model in a runtime_env of its own, whose engine runs in a Ray actor)."""
    return [m["id"] for m in stack.cfg.get("models") or [] if not m.get("runtime_env")]


class SwapFault:
    """`model-swap`: the interface of faults.Fault (applies, prepare, inject, recovered, report)."""

    name = component = NAME
    freeze_s = None

    def __init__(self, stack: StackProcess, served: str, deadline_s: float = 30.0):
        self.stack, self.served = stack, served
        self.models = catalogue_models(stack)
        self.resident, self.cold = (self.models + [None, None])[:2]  # the cold one: chosen again at the kill
        self.wakes = Traffic(stack.url, self.cold or "", rate=1.0, deadline_s=deadline_s, seed=7)
        self._started: threading.Thread | None = None
        self.killed: list[int] = []

    def applies(self) -> bool:
        """Whether the stack has a catalogue of two models at least."""
        return self.cold is not None

    def prepare(self) -> None:
        """Makes the first catalogue model resident (memory full), before the traffic starts."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = httpx.post(f"{self.stack.url}/v1/chat/completions", timeout=120, json={
                "model": self.resident, "max_tokens": 4, "messages": [{"role": "user", "content": "wake"}]})
            if r.status_code == 200:
                return
            time.sleep(float(r.headers.get("retry-after", 1)))  # waking, or waiting out a minimum residence
        raise RuntimeError(f"{self.resident} did not become resident: {r.status_code} {r.text[:200]}")

    def inject(self) -> str:
        """Starts a request for a catalogue model that is not resident (the second, unless the
        residency chose otherwise), and SIGKILLs the engine its wake forks, MID_WAKE_S after the
        fork. Changes the stack: one engine start dies."""
        import psutil

        listing = self._listing()
        cold = [m for m in self.models if not listing[m]["resident"]]
        if not cold:
            return "none: every catalogue model is resident"
        if not listing[self.served]["pids"]:
            return f"none: {self.served} is not resident"
        self.cold = self.wakes.model = cold[0]
        standby = psutil.Process(listing[self.served]["pids"][0]).parent()  # the forkserver of the engines
        before = {p.pid for p in standby.children(recursive=True)}
        self._started = threading.Thread(target=self.wakes.send_one, args=("wake up",), daemon=True)
        self._started.start()
        deadline = time.monotonic() + FORK_WAIT_S
        while time.monotonic() < deadline:
            new = [p for p in standby.children(recursive=False) if p.pid not in before]
            if new:
                time.sleep(MID_WAKE_S)
                procs = [p for root in new for p in (root, *_children(root))]
                for p in procs:
                    try:
                        p.kill()
                        self.killed.append(p.pid)
                    except psutil.NoSuchProcess:
                        pass
                return f"{self.cold}'s engine, pids {self.killed}, {MID_WAKE_S} s into its start"
            time.sleep(0.02)
        return "none: no engine was forked"

    def recovered(self) -> bool:
        """Whether the wake's request has ended and a new request for the cold model is answered
        (that request wakes it again, when no other is under way). Sends one request."""
        if self._started is not None and self._started.is_alive():
            return False
        return self.wakes.send_one("wake up").outcome() == "ok"

    def report(self) -> dict:
        """The wake's requests, as the client saw them: the first is the one the kill met."""
        first = self.wakes.attempts[0] if self.wakes.attempts else None
        return {"engine_killed": self.killed, "swap_request": first and first.outcome(),
                "swap_request_status": first and first.status,
                "swap_request_body": first and first.body[:300].decode(errors="replace"),
                "swap_requests": counts(self.wakes.attempts)}

    def _listing(self) -> dict[str, dict]:
        """The catalogue as /v1/models lists it: model -> {"resident", "pids", ...}."""
        r = httpx.get(f"{self.stack.url}/v1/models", timeout=30)
        r.raise_for_status()
        return {m["id"]: m["baton"] for m in r.json()["data"]}


def _children(proc) -> list:
    import psutil

    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
