"""The load generator: workloads and statistics (pure), and the driver against
a fake OpenAI endpoint that streams SSE from a thread on 127.0.0.1."""

import asyncio
import csv
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.common import loadgen
from bench.load import load as bench_load
from bench.serve import serve as bench_serve
from bench.common.loadgen import CHAT, COMPLETIONS, SESSION_HEADER, RequestResult, RequestSpec

# -- arrivals and sessions --------------------------------------------------------


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate():
    a = loadgen.poisson_arrivals(20000, rate=5.0, seed=7)
    assert a == loadgen.poisson_arrivals(20000, rate=5.0, seed=7)
    assert a != loadgen.poisson_arrivals(20000, rate=5.0, seed=8)
    assert all(x < y for x, y in zip(a, a[1:]))
    assert len(a) / a[-1] == pytest.approx(5.0, rel=0.03)
    with pytest.raises(ValueError):
        loadgen.poisson_arrivals(3, rate=0, seed=0)


def test_sessions_follow_shared_two_block_prefixes():
    ids = [[0, 1, 2], [0, 5], [0, 1, 2, 3], [0, 1, 2, 3, 4], [7], [0, 5, 6], [0, 8]]
    assert loadgen.detect_sessions(ids) == ["s0", "s1", "s0", "s0", "s2", "s1", "s3"]


# -- trace replay -------------------------------------------------------------------


def _trace(tmp_path):
    rows = [
        {"timestamp": 1000, "input_length": 1024, "output_length": 512, "hash_ids": [0, 1]},          # A
        {"timestamp": 3000, "input_length": 1536, "output_length": 100, "hash_ids": [0, 1, 2]},       # B extends A
        {"timestamp": 2000, "input_length": 1024, "output_length": 64, "hash_ids": [0, 7]},           # C
        {"timestamp": 4000, "input_length": 100000, "output_length": 5000, "hash_ids": list(range(100, 296))},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_replay_scales_times_and_lengths_and_shares_prefixes(tmp_path):
    specs = loadgen.trace_workload(_trace(tmp_path), time_scale=0.5, tokens_per_block=16,
                                   max_output_tokens=100, max_model_len=2048)
    a, c, b, d = specs
    assert [s.at_s for s in specs] == [0.0, 0.5, 1.0, 1.5]
    assert [s.endpoint for s in specs] == [COMPLETIONS] * 4
    assert [s.input_tokens for s in specs] == [32, 32, 48, 2048 - 100]
    assert [s.body["max_tokens"] for s in specs] == [16, 2, 3, 100]
    assert [len(s.body["prompt"]) for s in specs] == [32, 32, 48, 1948]
    assert all(s.body["ignore_eos"] for s in specs)
    assert b.body["prompt"][:32] == a.body["prompt"]                  # hash ids 0, 1
    assert c.body["prompt"][:16] == a.body["prompt"][:16]             # hash id 0 only
    assert c.body["prompt"][16:] != a.body["prompt"][16:32]
    assert a.body["prompt"][:16] == loadgen.block_tokens(0, 16)
    assert all(6 <= t < 1000 for s in specs for t in s.body["prompt"])
    assert a.session_id == b.session_id and len({a.session_id, c.session_id, d.session_id}) == 3
    assert a.headers == b.headers == {SESSION_HEADER: a.session_id}
    assert c.headers == d.headers == {}
    again = loadgen.trace_workload(_trace(tmp_path), time_scale=0.5, limit=2, session_header=False)
    assert [s.body["prompt"] for s in again] == [a.body["prompt"], b.body["prompt"]]
    assert all(s.headers == {} for s in again)


def test_synthetic_workloads():
    pre = loadgen.synthetic_workload("prefill-heavy", 10, rate=2.0, seed=1)
    assert [s.at_s for s in pre] == loadgen.poisson_arrivals(10, 2.0, 1)
    assert all(1350 <= s.input_tokens <= 1650 and s.body["max_tokens"] == 16 for s in pre)
    dec = loadgen.synthetic_workload("decode-heavy", 3, seed=1)
    assert [s.at_s for s in dec] == [0.0] * 3
    assert all(s.input_tokens <= 71 and s.body["max_tokens"] == 256 for s in dec)
    ag = loadgen.synthetic_workload("agentic", 2, turns=3, seed=1, words=["alpha", "beta"])
    assert [(s.session_id, s.turn) for s in ag] == [(f"agent-1-{i}", t) for i in range(2) for t in range(3)]
    assert all(s.endpoint == CHAT and s.chat_history and s.headers[SESSION_HEADER] == s.session_id for s in ag)
    with pytest.raises(ValueError):
        loadgen.synthetic_workload("nope", 1)


# -- statistics ---------------------------------------------------------------------


def test_summarize_exact_numbers():
    rs = [
        RequestResult(0, ttft_s=0.1, tpot_s=0.01, e2e_s=1.0, input_tokens=100, output_tokens=10, cached_tokens=50),
        RequestResult(1, ttft_s=0.2, tpot_s=0.02, e2e_s=2.0, input_tokens=100, output_tokens=20),
        RequestResult(2, ttft_s=0.5, tpot_s=0.2, e2e_s=3.0, input_tokens=100, output_tokens=30),   # TPOT miss
        RequestResult(3, ttft_s=2.0, tpot_s=0.01, e2e_s=4.0, input_tokens=100, output_tokens=40),  # TTFT miss
        RequestResult(4, error="HTTP 500"),
        RequestResult(5, ttft_s=0.3, e2e_s=0.3, input_tokens=0, output_tokens=1),  # one token: no TPOT
    ]
    s = loadgen.summarize(rs, slo_ttft_s=1.0, slo_tpot_s=0.1, wall_s=10.0)
    assert (s["requests"], s["completed"], s["errors"]) == (6, 5, 1)
    assert s["requests_per_s"] == 0.5
    assert s["output_tokens_per_s"] == 10.1
    assert s["input_tokens_per_s"] == 40.0
    assert s["goodput"] == 0.5 and s["goodput_requests_per_s"] == 0.3
    assert s["ttft_p50_s"] == 0.3                      # 0.1 0.2 0.3 0.5 2.0
    assert s["ttft_p90_s"] == pytest.approx(1.4)       # 0.5 + 0.6 * 1.5
    assert s["ttft_p99_s"] == pytest.approx(1.94)
    assert s["tpot_p50_s"] == pytest.approx(0.015)     # 0.01 0.01 0.02 0.2
    assert s["tpot_p90_s"] == pytest.approx(0.146)
    assert s["e2e_p50_s"] == 2.0 and s["e2e_p99_s"] == pytest.approx(3.96)
    assert s["cached_token_share"] == 0.125
    empty = loadgen.summarize([], 1.0, 0.1, 1.0)
    assert empty["ttft_p50_s"] is None and empty["goodput"] is None
    json.dumps(s, allow_nan=False)


# -- the driver against a fake streaming endpoint --------------------------------------


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Streams max_tokens one-word deltas: first after 20 ms, then every 5 ms.

    max_tokens 999 never finishes in time; a prompt starting with token 5 gets a 400.
    """

    seen: list = []

    def log_message(self, *args):
        pass

    def _send(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()))
        if isinstance(body.get("prompt"), list) and body["prompt"][0] == 5:
            msg = json.dumps({"error": {"message": "bad prompt"}}).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chat = self.path.endswith("chat/completions")
        n = body.get("max_tokens") or body["max_completion_tokens"]
        if chat:
            self._send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        time.sleep(0.02 if n != 999 else 3)
        for i in range(n):
            piece = f"w{i} "
            self._send({"choices": [{"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}]})
            time.sleep(0.005)
        prompt = len(body["prompt"]) if "prompt" in body else sum(len(m["content"]) for m in body["messages"])
        self._send({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                             "prompt_tokens_details": {"cached_tokens": 0}}})
        self._send("[DONE]")


@pytest.fixture
def fake_server():
    _FakeOpenAI.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    server.daemon_threads = True
    server.block_on_close = False  # the never-finishing request must not hold up teardown
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _FakeOpenAI.seen
    server.shutdown()
    server.server_close()


@pytest.mark.quiet  # times the fake server's tokens (tpot >= 4 ms): starved beside e2e, they came in bursts
def test_bench_load_replays_a_trace_and_writes_json_and_csv(fake_server, tmp_path, capsys):
    url, seen = fake_server
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    rc = bench_load.main(["--url", url, "--workload", "trace", "--trace", str(_trace(tmp_path)),
                          "--time-scale", "0.01", "--max-output-tokens", "8", "--no-progress",
                          "--out-json", str(out_json), "--out-csv", str(out_csv)])
    assert rc == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["requests"], line["completed"], line["errors"]) == (4, 4, 0)
    assert 0.02 <= line["ttft_p50_s"] < 1.0 and 0.004 <= line["tpot_p50_s"] < 0.5
    assert line["goodput"] == 1.0 and line["sessions"] == 3
    with_header = sorted((h[SESSION_HEADER], len(b["prompt"])) for _, h, b, _ in seen if SESSION_HEADER in h)
    assert len(with_header) == 2 and with_header[0][0] == with_header[1][0]   # A and B, one id
    assert [n for _, n in with_header] == [32, 48]                            # C and D send none
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} and b["model"] == "baton-tiny"
               for _, _, b, _ in seen)
    saved = json.loads(out_json.read_text())
    assert saved["summary"]["completed"] == 4 and len(saved["requests"]) == 4
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 4 and all(float(r["ttft_s"]) > 0 and r["error"] == "" for r in rows)
    assert [int(r["output_tokens"]) for r in rows] == [8, 2, 3, 8]


def test_agentic_turns_wait_and_resend_the_conversation(fake_server):
    url, seen = fake_server
    specs = loadgen.synthetic_workload("agentic", 2, turns=3, seed=0, input_tokens=5, output_tokens=4,
                                       words=["hi", "there"])
    results, summary = bench_load.run(url, specs, progress=False)
    assert summary["completed"] == 6 and all(r.output_tokens == 4 for r in results)
    for sid in ("agent-0-0", "agent-0-1"):
        turns = [(b["messages"], t) for _, h, b, t in seen if h.get(SESSION_HEADER) == sid]
        assert [len(m) for m, _ in turns] == [1, 3, 5]
        assert turns[1][0][1] == {"role": "assistant", "content": "w0 w1 w2 w3 "}
        assert turns[2][0][:3] == turns[1][0]
        assert turns[0][1] < turns[1][1] < turns[2][1]


def test_errors_timeouts_and_the_deadline_become_results(fake_server):
    url, _ = fake_server
    body = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
    specs = [RequestSpec(0, 0.0, COMPLETIONS, {**body, "prompt": [7, 8]}),
             RequestSpec(1, 0.0, COMPLETIONS, {**body, "prompt": [5, 8]}),
             RequestSpec(2, 0.0, COMPLETIONS, {**body, "prompt": [7], "max_tokens": 999}),
             RequestSpec(3, 5.0, COMPLETIONS, {**body, "prompt": [7]})]
    start = time.monotonic()
    results, summary = bench_load.run(url, specs, progress=False, timeout_s=0.5, deadline_s=1.0)
    assert time.monotonic() - start < 3
    assert results[0].ok and results[0].output_tokens == 2
    assert results[1].error.startswith("RuntimeError: HTTP 400")
    assert results[2].error == "timeout after 0.5s"
    assert "deadline" in results[3].error and math.isnan(results[3].ttft_s)
    assert (summary["completed"], summary["errors"]) == (1, 3)


def test_bench_serve_drives_vllms_benchmark_and_reports_ratios(fake_server):
    from bench.common import vllm_load
    from common.config import load_config

    url, seen = fake_server
    cfg = load_config(None, environ={})
    out = vllm_load.run(url, "baton-tiny", str(cfg.model.resolved_path()), vllm_load.Workload(6, 2, 20, 5))
    assert out["completed"] == 6 and out["failed"] == 0 and out["request_throughput"] > 0
    bodies = [b for p, _, b, _ in seen if p == "/v1/chat/completions"]
    assert len(bodies) == 6 + 2  # two uncounted warm-ups
    assert all(b["ignore_eos"] and b["stream"] and b["max_completion_tokens"] == 5 for b in bodies)
    results = {"vllm_serve": {"c8": {"request_throughput": 20.0, "median_ttft_ms": 50.0, "median_tpot_ms": 4.0}},
               "baton": {"c8": {"request_throughput": 19.0, "median_ttft_ms": 55.0, "median_tpot_ms": 4.0}}}
    assert bench_serve.ratios(results, "vllm_serve") == {
        "baton": {"c8": {"request_throughput": 0.95, "median_ttft_ms": 1.1, "median_tpot_ms": 1.0}}}
    assert bench_serve.ratios(results, "absent") == {}


def test_run_works_inside_a_running_event_loop(fake_server):
    url, _ = fake_server
    specs = loadgen.synthetic_workload("decode-heavy", 2, seed=0, input_tokens=4, output_tokens=3)

    async def notebook_cell():
        return bench_load.run(url, specs, progress=False)

    results, summary = asyncio.run(notebook_cell())
    assert summary["completed"] == 2 and [r.output_tokens for r in results] == [3, 3]


def test_bench_serve_prompts_never_share_a_prefix_block():
    """vLLM's `random` dataset repeats whole prompts with a 1024-token vocabulary."""
    from transformers import AutoTokenizer

    from bench.common import vllm_load
    from common.config import load_config

    path = str(load_config(None, environ={}).model.resolved_path())
    w = vllm_load.Workload(200, 8, input_len=120, seed=3)
    texts = vllm_load.prompts(path, w)
    tok = AutoTokenizer.from_pretrained(path)
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert len(texts) == 202 and all(115 <= len(i) <= 125 for i in ids)
    assert len({tuple(i[:16]) for i in ids}) == len(ids)
    assert vllm_load.prompts(path, w) == texts  # the seed picks them
    assert vllm_load.prompts(path, vllm_load.Workload(200, 8, input_len=120, seed=4)) != texts
