"""`baton bench overload` without a stack: statistics, ratios, table, plot,
arguments, the wiring per ingress count, and the open-loop sender against a
tiny in-process aiohttp server."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from aiohttp import web

from bench.overload import overload
from bench.common.loadgen import CHAT, RequestSpec
from bench.overload.overload import Outcome, add_ratios, level_stats, tenant_stats
from bench.overload.overload_plot import COLUMNS, markdown_table, plot
from common.config import BatonConfig
from common.constants import REPO_ROOT


def _outcomes(tenant: str, ok: int = 0, r429: int = 0, bare429: int = 0, r5xx: int = 0,
              slow: int = 0) -> list[Outcome]:
    out = [Outcome(tenant, 200, ttft_s=0.1, tokens=3, first_s=0.5) for _ in range(ok)]
    out += [Outcome(tenant, 200, ttft_s=9.0, tokens=3, first_s=0.5) for _ in range(slow)]
    out += [Outcome(tenant, 429, retry_after=True, error="shed") for _ in range(r429)]
    out += [Outcome(tenant, 429, retry_after=False, error="shed") for _ in range(bare429)]
    out += [Outcome(tenant, 503, error="down") for _ in range(r5xx)]
    return out


def _level(x: float, goodput: float, light_pct: float | None = 100.0, heavy_pct: float = 100.0,
           r429: int = 0, bare: int = 0, r5xx: int = 0) -> dict:
    def tenant(pct, n429, nbare, n5xx):
        return {"sent": 10, "succeeded": 5, "status_codes": {"200": 5, "429": n429}, "rejected_429": n429,
                "429_without_retry_after": nbare, "5xx": n5xx, "pct_of_fair_share": pct}
    return {"x": x, "offered_rps": 10.0 * x, "goodput_rps": goodput, "goodput_ratio": None,
            "tenants": {"light": tenant(light_pct, 0, 0, 0), "heavy": tenant(heavy_pct, r429, bare, r5xx)}}


def _doc() -> dict:
    runs = {}
    for n, scale in (("1", 1.0), ("2", 1.8)):
        levels = {f"{x:g}x": _level(x, g * scale, lp, 100.0 - x, r429=int(x * 10), bare=int(x == 20), r5xx=0)
                  for x, g, lp in ((1, 10.0, 100.0), (2, 9.5, 99.0), (5, 8.5, 92.0), (10, 7.0, 85.0),
                                   (20, 5.0, None))}
        runs[n] = add_ratios({"ingress_replicas": int(n), "capacity_rps": 10.0 * scale, "levels": levels})
    return {"runs": runs, "command": ["baton", "bench", "overload"]}


# -- statistics --------------------------------------------------------------------


def test_tenant_stats_counts_rejections_and_fair_share_of_what_was_delivered():
    outs = _outcomes("heavy", ok=60, r429=30, bare429=2, r5xx=1) + _outcomes("light", ok=9, r429=1)
    stats = tenant_stats(outs, duration_s=10, slo_ttft_s=2.0)
    heavy, light = stats["heavy"], stats["light"]
    assert heavy["sent"] == 93 and heavy["succeeded"] == 60 and heavy["good"] == 60
    assert heavy["status_codes"] == {"200": 60, "429": 32, "503": 1}
    assert heavy["rejected_429"] == 32 and heavy["429_without_retry_after"] == 2 and heavy["5xx"] == 1
    assert light["429_without_retry_after"] == 0 and light["5xx"] == 0
    # Delivered 6.9/s; demands 9.3/s and 1.0/s: light's fair share is all of its
    # 1.0/s (it got 0.9/s), heavy's the other 5.9/s (it got 6.0/s).
    assert light["pct_of_fair_share"] == 90.0
    assert heavy["pct_of_fair_share"] == round(100 * 6.0 / 5.9, 1)


def test_level_stats_goodput_counts_only_successes_within_the_slo_and_the_window():
    outs = _outcomes("heavy", ok=8, slow=4, r429=5) + _outcomes("light", ok=2)
    outs.append(Outcome("light", 200, ttft_s=0.1, tokens=3, first_s=2.1))  # started after the window
    outs.append(Outcome("light", 200, ttft_s=0.1, tokens=3, first_s=1.9))  # started inside: counts
    lv = level_stats(2, outs, wall_s=3.0, capacity_rps=5.0, duration_s=2.0, slo_ttft_s=2.0)
    assert lv["goodput_rps"] == 5.5 and lv["offered_rps"] == 10.0 and lv["requests"] == 21
    assert lv["goodput_ratio"] is None and set(lv["tenants"]) == {"heavy", "light"}


def test_outcome_ok_needs_a_200_with_tokens_and_no_error():
    assert Outcome("a", 200, tokens=1).ok
    assert not Outcome("a", 200, tokens=0).ok
    assert not Outcome("a", 200, tokens=2, error="stream error").ok
    assert not Outcome("a", 429, tokens=0, error="shed").ok


def test_add_ratios_divides_by_goodput_at_1x():
    run = add_ratios({"levels": {"1x": _level(1, 10.0), "2x": _level(2, 9.0), "5x": _level(5, 7.5)}})
    assert [lv["goodput_ratio"] for lv in run["levels"].values()] == [1.0, 0.9, 0.75]


@pytest.mark.parametrize("levels", [{"2x": _level(2, 9.0)}, {"1x": _level(1, 0.0), "2x": _level(2, 1.0)}])
def test_add_ratios_without_a_usable_base_gives_none(levels):
    assert all(lv["goodput_ratio"] is None for lv in add_ratios({"levels": levels})["levels"].values())


# -- report --------------------------------------------------------------------------


def test_markdown_table_rows_and_columns():
    lines = markdown_table(_doc()).splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    assert len(lines) == 2 + 2 * 5
    assert all(line.count("|") == len(COLUMNS) + 1 for line in lines)
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first == ["1", "1×", "10.0", "10.00", "1.00", "100%", "99%", "10 (yes)", "0", "–"]
    last = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert last[:2] == ["2", "20×"] and last[4] == "0.50" and last[5] == "–"
    assert last[7] == "200 (no: 1 without)"


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "img" / "overload.png"
    plot(_doc(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- arguments and wiring --------------------------------------------------------------


def test_argument_defaults():
    args = overload.build_parser().parse_args([])
    assert overload.parse_levels(args.levels) == [1, 2, 5, 10, 20]
    assert args.ingress == [1, 2] and args.mode == "colocated"
    assert args.out == REPO_ROOT / "docs/results/overload/overload.json"
    assert args.plot == REPO_ROOT / "docs/results/overload/overload.png"
    assert args.duration == 20 and args.slo_ttft == 2.0 and args.markdown is None
    assert overload.build_parser().parse_args(["--ingress", "3"]).ingress == [3]
    with pytest.raises(SystemExit):
        overload.build_parser().parse_args(["--ingress", "0"])


def test_specs_split_load_between_tenants_with_the_deadline_header():
    specs = overload._specs(rate=11.0, duration_s=10, seed=0, max_tokens=8, deadline_s=2.0)
    by = {t: [s for s in specs if s.session_id == t] for t in ("heavy", "light")}
    assert len(by["heavy"]) == 100 and len(by["light"]) == 10
    assert all(s.headers["x-baton-deadline-s"] == "2.0" for s in specs)
    assert by["light"][0].headers["authorization"] == "Bearer key-light"


class _FakeStack:
    configs: list[dict] = []

    def __init__(self, config: Path):
        import yaml

        _FakeStack.configs.append(yaml.safe_load(config.read_text()))
        self.url, self.stopped = "http://fake", False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True


def test_main_measures_each_ingress_count_and_writes_json_table_and_plot(tmp_path, monkeypatch, capsys):
    _FakeStack.configs = []
    monkeypatch.setattr(overload, "StackProcess", _FakeStack)
    monkeypatch.setattr(overload, "bench_workdir", lambda name: tmp_path / name)
    monkeypatch.setattr(overload, "_calibrate", lambda url, n, args: 5.0 * n)
    monkeypatch.setattr(overload, "_level", lambda url, cap, x, args: _level(x, cap / x ** 0.2))
    out, png, md = tmp_path / "o.json", tmp_path / "o.png", tmp_path / "o.md"
    argv = ["--levels", "1,2", "--out", str(out), "--plot", str(png), "--markdown", str(md)]
    assert overload.main(argv) == 0
    doc = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == doc
    assert doc["command"] == ["baton", "bench", "overload", *argv]
    assert sorted(doc["runs"]) == ["1", "2"] and doc["runs"]["2"]["capacity_rps"] == 10.0
    assert [lv["goodput_ratio"] for lv in doc["runs"]["1"]["levels"].values()] == [1.0, round(2 ** -0.2, 3)]
    assert [(c["colocated"], c["decode"]["replicas"]) for c in _FakeStack.configs] == [(True, 1), (True, 2)]
    assert _FakeStack.configs[0]["admission"]["capacity_per_replica"] == 4
    assert BatonConfig.model_validate(_FakeStack.configs[1]).decode.replicas == 2
    assert md.read_text().startswith("| ingress replicas |") and png.stat().st_size > 0


# -- the open-loop sender against a tiny server ------------------------------------------


async def _chat(request: web.Request) -> web.StreamResponse:
    kind = request.headers["authorization"].split()[-1]
    if kind == "shed":
        return web.json_response({"error": "busy"}, status=429, headers={"Retry-After": "3"})
    if kind == "bare":
        return web.json_response({"error": "busy"}, status=429)
    if kind == "broken":
        return web.json_response({"error": "boom"}, status=500)
    if kind == "slow":
        await asyncio.sleep(1)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for piece in ("", "hello", " world"):
        chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


def test_send_open_loop_records_status_retry_after_and_ttft():
    kinds = ["ok", "shed", "bare", "broken", "slow"]
    specs = [RequestSpec(index=i, at_s=0.01 * i, endpoint=CHAT, session_id=k,
                         body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                         headers={"authorization": f"Bearer {k}"}) for i, k in enumerate(kinds)]

    async def scenario():
        app = web.Application()
        app.router.add_post(CHAT, _chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await overload.send_open_loop(f"http://127.0.0.1:{port}/", specs, timeout_s=0.5)
        finally:
            await runner.cleanup()

    outs, wall = asyncio.run(scenario())
    by = dict(zip(kinds, outs))
    assert by["ok"].ok and by["ok"].tokens == 2 and 0 <= by["ok"].ttft_s < 0.5
    assert (by["shed"].status, by["shed"].retry_after, by["shed"].ok) == (429, True, False)
    assert (by["bare"].status, by["bare"].retry_after) == (429, False)
    assert by["broken"].status == 500 and not by["broken"].ok
    assert by["slow"].status == 0 and "timeout" in by["slow"].error and math.isnan(by["slow"].ttft_s)
    assert wall < 5
