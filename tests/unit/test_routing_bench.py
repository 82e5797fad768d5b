import json

from bench.router import router as bench_router
from common.constants import TRACE


def test_bench_on_the_head_of_the_real_trace(capsys, tmp_path):
    head = tmp_path / "head.jsonl"
    with open(TRACE, encoding="utf-8") as f:
        head.write_text("".join(next(f) for _ in range(500)))
    assert bench_router.main(["--trace", str(head), "--capacity", "200"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    policies = {"baton", "round_robin", "least_loaded", "text_prefix_tree", "greedy_capped"}
    assert policies | {"pooled_bound", "unbounded"} <= set(out["hit_ratio"])
    assert policies <= set(out["imbalance"])
    assert all(0.0 <= v <= 1.0 for v in out["hit_ratio"].values())
    assert all(v >= 1.0 for v in out["imbalance"].values())
    assert out["hit_ratio"]["baton"] >= out["hit_ratio"]["round_robin"]
    assert out["hit_ratio"]["unbounded"] >= out["hit_ratio"]["pooled_bound"]
    assert out["requests"] == 500
    assert 0 < out["baton_latency_us"]["p50"] <= out["baton_latency_us"]["p99"]


def test_limit_and_plot(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1000 * i, "input_length": 1024, "output_length": 8, "hash_ids": [0, i % 3, 10 + i]}
        for i in range(30)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot = tmp_path / "p.png"
    assert (
        bench_router.main(
            ["--trace", str(trace), "--limit", "20", "--replicas", "2", "--capacity", "4", "--plot", str(plot)]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 20 and out["replicas"] == 2
    assert plot.stat().st_size > 0


def test_churn_adds_a_replica_that_gets_work(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1000 * i, "input_length": 1536, "output_length": 8, "hash_ids": [0, 100 + i, 200 + i]}
        for i in range(60)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench_router.main(["--trace", str(trace), "--replicas", "3", "--capacity", "20", "--churn"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["new_replica_work_share"]) == {
        "baton",
        "round_robin",
        "least_loaded",
        "text_prefix_tree",
        "greedy_capped",
    }
    assert out["new_replica_work_share"]["baton"] > 0
