"""`baton bench scale` in a short mode, so the bench cannot rot: the same simulated engine under
`vllm serve` and under Baton at two rates, and agent sessions on a small simulated fleet."""

from __future__ import annotations

import json
import os
import time

import psutil

from bench.scale import scale


def _listeners() -> set[tuple[str, int, int]]:
    """(address, port, pid) of every TCP listener on this machine."""
    return {(c.laddr.ip, c.laddr.port, c.pid or 0) for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def _left_by_test(before: set, pids_before: set[int]) -> list[str]:
    """Listeners opened since `before` by processes this test started: not by a process that was
    already running, nor by a child of one (the shared stack's Ray may start workers meanwhile);
    a daemon the test started and orphaned (Ray's HAProxy) has only init above it."""
    out = []
    for ip, port, pid in _listeners() - before:
        try:
            proc = psutil.Process(pid)
            elders = {p.pid for p in proc.parents()} - {1, os.getpid()}
            if pid in pids_before or elders & pids_before:
                continue
            out.append(f"{ip}:{port} {proc.name()} (pid {pid})")
        except psutil.NoSuchProcess:
            continue
    return out


def test_front_sweep_measures_the_systems_on_the_timed_executor(tmp_path):
    """`vllm serve`, Baton colocated and Baton disaggregated (`baton_pd`: each prompt computed on
    the prefill engine, saved to the real Mooncake store and loaded by decode, the hop timed by the
    profile). Also: the bench leaves nothing listening (it starts `vllm serve`, Ray, Mooncake and
    Baton's stacks)."""
    me = psutil.Process()
    before, pids_before = _listeners(), set(psutil.pids()) - {me.pid} - {p.pid for p in me.parents()}
    out = tmp_path / "scale.json"
    assert scale.main(["--systems", "vllm_serve,baton,baton_pd", "--rates", "20,40", "--duration", "3",
                       "--rounds", "1", "--out", str(out), "--plot", str(tmp_path / "scale.png")]) == 0
    doc = json.loads(out.read_text())
    results = doc["rounds"][0]["results"]
    for system, rows in results.items():
        assert [r["offered_rps"] for r in rows] == [20, 40], system
        for r in rows:
            assert r["errors"] == {} and r["ok"] == r["sent"], (system, r)
            assert r["goodput_rps"] > 0.7 * r["offered_rps"], (system, r)
            # the engine's own timing came back on every answer, so the added latency is measured
            assert r["with_engine_metrics"] == r["ok"] and r["added_p50_ms"] is not None, (system, r)
            assert r["cpu_ms_per_request"]["front"] > 0 and r["cpu_ms_per_request"]["engine"] > 0, (system, r)
    assert all("redis_cmds_per_request" in r for r in results["baton"])
    for r in results["baton_pd"]:
        assert r["cpu_ms_per_request"]["prefill"] > 0, r  # the prefill replica's front ran every prompt
        # vLLM's own count: decode took the prompts' full blocks (5-6 of 16 tokens each) from the store
        assert r["kv_loaded_tokens_per_request"] >= 48, r
    assert all(r["kv_loaded_tokens_per_request"] == 0 for r in results["baton"] + results["vllm_serve"])
    ratios = doc["rounds"][0]["ratios"]
    assert 0.7 < ratios["baton_goodput_at_vllm_knee"] < 1.3
    assert (tmp_path / "scale.png").stat().st_size > 0
    deadline = time.monotonic() + 60  # processes the bench stopped may take a moment to close
    while (left := _left_by_test(before, pids_before)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"the bench left listeners behind: {sorted(left)}"


def test_agent_sessions_on_a_simulated_fleet_keep_their_prefixes(tmp_path):
    out = tmp_path / "agentic.json"
    assert scale.main(["--part", "agentic", "--fleet", "4", "--session-rate", "4", "--think-s", "2", "--duration", "10",
                       "--rounds", "1", "--out", str(out), "--plot", str(tmp_path / "agentic.png")]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    baton, rr = run["baton"], run["round_robin"]
    # the same sessions under both policies; later turns' arrivals follow each policy's answers
    assert baton["requests"] > 40 and abs(baton["requests"] - rr["requests"]) <= 0.1 * rr["requests"]
    assert baton["unanswered"] == rr["unanswered"] == 0
    assert baton["predicted_exact"] >= 0.99  # the index's prediction is what the engine found cached
    assert baton["cached_vs_oracle"] >= 0.95
    assert baton["cached_share"] > rr["cached_share"]
    assert run["ratios"]["later_ttft_p50_ms"] < 1.0


def test_the_conversation_trace_replays_on_a_simulated_fleet(tmp_path):
    out = tmp_path / "trace.json"
    assert scale.main(["--part", "agentic", "--workload", "trace", "--fleet", "2", "--trace-speed", "20",
                       "--trace-limit", "60", "--rounds", "1", "--out", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["workload"] == "trace" and run["shape"]["skipped"] < 60
    baton, rr = run["baton"], run["round_robin"]
    assert baton["requests"] == rr["requests"] > 20 and baton["unanswered"] == rr["unanswered"] == 0
    assert 0 < baton["oracle_share"] <= 1 and baton["cached_share"] <= baton["oracle_share"] + 0.05
    assert baton["predicted_exact"] >= 0.95
