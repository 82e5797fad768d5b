"""`baton bench models` without engines: the level mapping, the Zipf mix, the statistics and
/metrics parsing, the usage check, the stack config, the driver against a tiny in-process
server, the order of the arms, the table and the plot."""

from __future__ import annotations

import asyncio
import json
import math
from argparse import Namespace
from collections import Counter

import pytest
import yaml
from aiohttp import web

from bench.models import models
from bench.common.loadgen import RequestResult
from bench.models.models import level_models, zipf_mix
from bench.models.models_plot import arm_stats, delta, metric_totals, plot, table, usage_check
from bench.models.models_stack import FIRST, MODELS, ratio, stack_config
from common.config import load_config
from common.config.models import catalogue_models


def test_levels_serve_the_first_level_times_room_models_hottest_first():
    assert MODELS[:5] == ["baton-tiny", "baton-small", "baton-medium", "baton-wide", "baton-deep"]
    assert len(MODELS) == len(set(MODELS)) == 13
    assert level_models(1, 2) == MODELS[:2] and level_models(2, 2) == MODELS[:4] and level_models(4, 3) == MODELS[:12]
    assert level_models(4, 1) == MODELS[:4]
    with pytest.raises(ValueError, match="needs 15 models"):
        level_models(5, 3)


def test_zipf_mix_is_seeded_and_the_two_hottest_get_most():
    ids = MODELS[:4]
    mix = zipf_mix(ids, 2000, 1.2, seed=3)
    assert mix == zipf_mix(ids, 2000, 1.2, seed=3) and mix != zipf_mix(ids, 2000, 1.2, seed=4)
    n = Counter(mix)
    assert set(n) == set(ids) and n[ids[0]] > n[ids[1]] > n[ids[2]] > n[ids[3]]
    assert n[ids[0]] + n[ids[1]] > 0.65 * len(mix)  # 1.435 / 1.892 of the weight
    assert zipf_mix(ids, 10, 0.0, seed=1) != [ids[0]] * 10


def test_ratio_is_none_without_both_values():
    assert ratio(1.0, 4.0) == 0.25 and ratio(None, 1.0) is None and ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


METRICS = """\
# TYPE baton_model_wakes_total counter
baton_model_wakes_total{model="baton-small"} 3.0
baton_model_wakes_total{model="baton-deep"} 1.0
# TYPE baton_model_wake_seconds histogram
baton_model_wake_seconds_bucket{le="5.0",model="baton-small"} 3.0
baton_model_wake_seconds_bucket{le="+Inf",model="baton-small"} 3.0
baton_model_wake_seconds_count{model="baton-small"} 3.0
baton_model_wake_seconds_sum{model="baton-small"} 7.5
# TYPE baton_model_evictions_total counter
baton_model_evictions_total{model="baton-tiny",why="evicted"} 2.0
# TYPE baton_usage_tokens_total counter
baton_usage_tokens_total{kind="prompt",model="baton-small",tenant="a"} 10.0
baton_usage_tokens_total{kind="prompt",model="baton-small",tenant="b"} 5.0
baton_usage_tokens_total{kind="completion",model="baton-small",tenant="a"} 4.0
# TYPE other_total counter
other_total 9.0
"""


def test_metric_totals_sum_usage_over_tenants_and_delta_keeps_changes():
    m = metric_totals(METRICS)
    assert m == {("wakes", "baton-small"): 3, ("wakes", "baton-deep"): 1, ("wake_s_count", "baton-small"): 3,
                 ("wake_s_sum", "baton-small"): 7.5, ("evictions", "baton-tiny", "evicted"): 2,
                 ("usage", "baton-small", "prompt"): 15, ("usage", "baton-small", "completion"): 4}
    before = {k: v for k, v in m.items() if k != ("wakes", "baton-deep")} | {("wakes", "baton-small"): 1}
    assert delta(m, before) == {("wakes", "baton-small"): 2, ("wakes", "baton-deep"): 1}
    assert delta(m, {k: v for k, v in m.items() if k[0] != "usage"}) == {
        ("usage", "baton-small", "prompt"): 15, ("usage", "baton-small", "completion"): 4}


def _row(model: str, ttft: float = 0.1, error: str | None = None, prompt: int = 10, completion: int = 4,
         cached: int = 0) -> tuple:
    r = RequestResult(index=0, ttft_s=ttft, error=error)
    if error is None:
        r.input_tokens, r.output_tokens, r.cached_tokens = prompt, completion, cached
    return model, r


def test_usage_check_compares_per_model_and_kind_and_reports_totals():
    rows = [_row("a", prompt=10, completion=4), _row("b", prompt=5, completion=2, cached=3),
            _row("b", error="HTTP 429: busy")]
    server = {("usage", "a", "prompt"): 10, ("usage", "a", "completion"): 4, ("usage", "b", "prompt"): 5,
              ("usage", "b", "completion"): 2, ("usage", "b", "cached"): 3, ("wakes", "b"): 1}
    out = usage_check(server, rows)
    assert out == {"counters": {"prompt": 15, "completion": 6, "cached": 3},
                   "clients": {"prompt": 15, "completion": 6, "cached": 3}, "equal": True}
    moved = {**server, ("usage", "a", "prompt"): 9, ("usage", "b", "prompt"): 6}  # same totals, wrong models
    assert usage_check(moved, rows)["equal"] is False


def test_arm_stats_counts_429s_apart_from_errors_and_takes_hot_ttft_only_from_hot_models():
    rows = [_row("hot1", 0.1), _row("hot2", 0.3), _row("cold", 5.0), _row("cold", error="HTTP 429: loading"),
            _row("hot1", error="ReadTimeout: ")]
    metrics = {("wakes", "cold"): 2, ("wake_s_sum", "cold"): 5.0, ("wake_s_count", "cold"): 2,
               ("evictions", "hot2", "evicted"): 1, ("usage", "hot1", "prompt"): 10,
               ("usage", "hot1", "completion"): 4, ("usage", "hot2", "prompt"): 10,
               ("usage", "hot2", "completion"): 4, ("usage", "cold", "prompt"): 10, ("usage", "cold", "completion"): 4}
    s = arm_stats(rows, ["hot1", "hot2"], metrics)
    assert (s["requests"], s["ok"], s["rejected_429"], s["errors"]) == (5, 3, 1, 1)
    assert s["hot_ttft_p50_s"] == pytest.approx(0.2) and s["hot_ttft_p95_s"] == pytest.approx(0.29)
    assert s["all_ttft_p50_s"] == pytest.approx(0.3)
    assert (s["wakes"], s["evictions"], s["wake_s_mean"]) == (2, 1, 2.5) and s["usage"]["equal"]
    assert s["by_model"] == {"hot1": 2, "hot2": 1, "cold": 2}
    assert "wakes" not in arm_stats(rows, ["hot1"]) and arm_stats([], ["x"])["hot_ttft_p50_s"] is None


def test_room_holds_the_largest_budgets_of_the_level(monkeypatch):
    from cluster.default_model import tiny_model

    monkeypatch.setattr(tiny_model, "generate_catalogue", lambda entries: None)
    b = models.budgets(MODELS[:4])
    assert list(b) == MODELS[:4] and all(0.25 * 2**30 <= v < 0.27 * 2**30 for v in b.values())
    room = models.room_gb(MODELS[:4], 2)
    two = sorted(b.values())[-2:]
    assert sum(two) <= room * 2**30 < sum(two) + 2**20 and room * 2**30 < sum(sorted(b.values())[:3])


def test_stack_config_is_a_colocated_catalogue_stack(tmp_path, monkeypatch):
    from cluster.default_model import tiny_model

    generated = []
    monkeypatch.setattr(tiny_model, "generate_catalogue", lambda entries: generated.extend(e.id for e in entries))
    path = stack_config(tmp_path / "a", MODELS[:4], 0.6, 5.0)
    cfg = load_config(path, environ={})
    assert [m.id for m in catalogue_models(cfg)] == MODELS[:4] and generated == MODELS[1:4]
    assert cfg.colocated and cfg.decode.replicas == 1 and cfg.catalogue.memory_gb == 0.6
    assert cfg.catalogue.min_resident_s == 5.0 and cfg.tracing.exporter == "none"
    assert load_config(stack_config(tmp_path / "b", MODELS, None, 2), environ={}).catalogue.memory_gb is None


# -- the driver against a tiny server ------------------------------------------------------


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body["model"] == "cold":
        return web.json_response({"error": {"message": "loading"}}, status=429, headers={"Retry-After": "3"})
    assert request.headers["x-baton-deadline-s"] == "60.0" and body["stream"]
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for piece in ("", "hello", " world"):
        await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': piece}}]})}\n\n".encode())
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    return resp


def test_drive_sends_each_request_to_its_model_and_records_usage_and_429s():
    async def scenario():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            mix = [(m, {"messages": [{"role": "user", "content": "hi"}]}) for m in ("hot", "cold", "hot")]
            return await models.drive(f"http://127.0.0.1:{port}", mix, concurrency=2, deadline_s=60.0)
        finally:
            await runner.cleanup()

    rows = asyncio.run(scenario())
    assert [m for m, _ in rows] == ["hot", "cold", "hot"]
    (_, a), (_, cold), (_, b) = rows
    assert a.ok and b.ok and (a.input_tokens, a.output_tokens, a.cached_tokens) == (7, 2, 1)
    assert not math.isnan(a.ttft_s) and a.ttft_s <= a.e2e_s
    assert cold.error.startswith("HTTP 429") and arm_stats(rows, ["hot"])["rejected_429"] == 1


# -- the arms, main, table and plot ----------------------------------------------------------


def _args(**kw) -> Namespace:
    base = dict(room=2, repeats=2, requests=20, concurrency=2, zipf_s=1.2, prompt_words=5, max_tokens=2,
                min_resident_s=2.0, deadline_s=60.0, seed=0, warmup=4)
    return Namespace(**{**base, **kw})


def test_run_level_sends_each_hot_model_alone_its_requests_at_the_overcommitted_times(tmp_path, monkeypatch):
    from cluster.default_model import tiny_model

    monkeypatch.setattr(tiny_model, "generate_catalogue", lambda entries: None)
    calls = []

    def fake_arm(args, config, first, hot, mix, label, warm, at=None):
        cfg = yaml.safe_load(config.read_text())
        listed = [m["id"] for m in cfg.get("models") or []]  # a catalogue: the stack's model, then these
        served = [FIRST, *listed] if listed else [cfg["model"]["served_name"]]
        calls.append((served, len(mix), {m for m, _ in mix}, at, cfg.get("catalogue", {}).get("memory_gb")))
        ttft = 0.2 if at is None else 0.1
        rows = [_row(m, ttft) for m, _ in mix]
        for i, (_, r) in enumerate(rows):
            r.sent_s = at[i] if at is not None else 0.5 * i
        return arm_stats(rows, hot, {}), rows

    monkeypatch.setattr(models, "measure_arm", fake_arm)
    out = models.run_level(_args(), 2, tmp_path)
    mix = models.zipf_mix(MODELS[:4], 20, _args().zipf_s, _args().seed + 2)
    # Each repeat: the overcommitted stack, then each hot model on a one-model stack of its own.
    assert [len(c[0]) for c in calls] == [4, 1, 1] * 2
    assert [c[0][0] for c in calls if len(c[0]) == 1] == MODELS[:2] * 2
    for served, n, sent, at, memory_gb in calls:
        if len(served) > 1:
            assert at is None and n == 20 and memory_gb == out["memory_gb"]
        else:  # only its own requests, at the times the overcommitted run sent them
            mine = [i for i, m in enumerate(mix) if m == served[0]]
            assert sent == {served[0]} and n == len(mine) > 0 and at == [0.5 * i for i in mine]
    assert out["models"] == MODELS[:4] and out["hot"] == MODELS[:2] and 0.5 <= out["memory_gb"] < 0.56
    assert out["ratio_p50"] == 2.0 and out["ratio_p95"] == 2.0 and len(out["repeats"]) == 2
    assert out["ratio_p95_by_model"] == {m: 2.0 for m in MODELS[:2]}
    assert out["overcommitted"]["requests"] == 40 and 1.9 < out["overcommit_actual"] <= 2.0


@pytest.mark.parametrize("argv, message", [(["--parts", "wake,nope"], "unknown parts"),
                                           (["--overcommit", "8"], "needs 24 models")])
def test_main_refuses_bad_arguments_before_starting_anything(argv, message, capsys):
    with pytest.raises(SystemExit):
        models.main(argv)
    assert message in capsys.readouterr().err


def _doc() -> dict:
    arm = {"hot_ttft_p50_s": 0.1, "hot_ttft_p95_s": 0.3, "rejected_429": 1, "errors": 0, "wakes": 4, "evictions": 3}
    return {"wake": {"model": "baton-small", "target_ratio": 0.25, "median_ratio": 0.1,
                     "rounds": [{"baton": {"ttft_s": 2.5, "wake_engine_s": 2.1}, "vllm_serve": {"ttft_s": 25.0},
                                 "ratio": 0.1}]},
            "overcommit": {"levels": {"2": {"overcommitted": arm, "baseline": {**arm, "hot_ttft_p50_s": 0.05},
                                            "ratio_p50": 2.0, "ratio_p95": 1.0, "usage_equal": True}}}}


def test_table_and_plot(tmp_path):
    text = table(_doc())
    assert "round 1: baton 2.50s" in text and "ratio 0.1" in text and "2x" in text and "True" in text
    plot(_doc(), tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0


def test_the_cli_runs_it():
    from cli.main import BENCHES

    assert "models" in BENCHES
