"""The site simulator and `baton bench sites` at a small scale: geography, the seeded workload,
the issue-35 targets (random-near against nearest-only under a 5x hotspot), session keep,
determinism, a dead site dropping out of the latency map, and the bench's JSON and plot."""

from __future__ import annotations

import json

import pytest

from bench.sites import sites as bench_sites
from bench.sites.sites_geo import CITIES, CITY, diurnal, fleet_hop_s, great_circle_km, pick, rtt_s
from bench.sites.sites_sim import SimConfig, SiteSim, simulate, workload
from cli.main import BENCHES

SMALL = SimConfig(duration_s=300.0, warmup_s=100.0)


@pytest.fixture(scope="module")
def small_runs() -> dict[str, dict]:
    return {p: simulate(SMALL, p) for p in ("random_near", "nearest_only", "local_only")}


def test_geography():
    assert len(CITIES) >= 60 and len({c.name for c in CITIES}) == len(CITIES)
    assert len({c.region for c in CITIES}) == 6
    assert great_circle_km(CITY["London"], CITY["Paris"]) == pytest.approx(344, abs=5)
    assert great_circle_km(CITY["NewYork"], CITY["London"]) == pytest.approx(5570, abs=30)
    assert rtt_s(CITY["London"], CITY["Paris"]) == pytest.approx(0.00444, abs=0.0001)  # 1 ms + 344 km / 100
    assert rtt_s(CITY["Tokyo"], CITY["Tokyo"]) == 0.0
    assert diurnal(4.0) == pytest.approx(0.2) and diurnal(16.0) == pytest.approx(1.0)
    assert diurnal(28.0) == pytest.approx(0.2) and 0.2 < diurnal(10.0) < 1.0
    assert 0.003 < fleet_hop_s(CITIES) < 0.010


def test_pick_spreads_over_regions_and_keeps_the_hotspot():
    ten = pick(10)
    assert len({c.region for c in ten}) == 6
    assert CITY["Auckland"] in pick(10, must="Auckland")
    assert len(pick(50)) == 50 and len(pick(len(CITIES))) == len(CITIES)
    with pytest.raises(ValueError):
        pick(1)
    with pytest.raises(ValueError):
        pick(10, must="Atlantis")


def test_workload_is_seeded_follows_the_clock_and_has_the_hotspot():
    cities = pick(70, "Frankfurt")
    a, b = workload(cities, SMALL), workload(cities, SMALL)
    assert [(s.origin, s.start, s.services) for s in a] == [(s.origin, s.start, s.services) for s in b]
    assert [s.start for s in workload(cities, SimConfig(duration_s=300.0, warmup_s=100.0, seed=1))] != \
        [s.start for s in a]
    per_permit = {}
    for s in a:
        c = cities[s.origin]
        per_permit[c.name] = per_permit.get(c.name, 0) + 1 / c.permits
    # At Frankfurt's 14:00 it is Europe's afternoon and the middle of the night in the US west.
    assert per_permit["Frankfurt"] > 3.5 * per_permit["Paris"]
    assert per_permit["Paris"] > 2.5 * per_permit.get("SanJose", 0.0)
    assert sum(len(s.services) for s in a) / len(a) == pytest.approx(SMALL.turns_mean, rel=0.1)


def test_random_near_meets_the_targets_against_nearest_only(small_runs):
    rn, no, lo = small_runs["random_near"], small_runs["nearest_only"], small_runs["local_only"]
    assert rn["requests"] == pytest.approx(no["requests"], rel=0.01)
    assert no["rejected"] > 0.03 * no["requests"] and lo["rejected"] > no["rejected"]
    assert rn["rejected"] <= 0.7 * no["rejected"]
    assert rn["util_max_over_mean"] <= 0.7 * no["util_max_over_mean"]
    assert no["util_hotspot"] > 0.95 and rn["util_hotspot"] < 0.8
    assert rn["added_rtt_ms"]["all_p50"] == 0.0
    assert rn["added_rtt_hops"]["forwarded_p50_fleet_hops"] <= 1.0
    assert rn["session_keep"] >= 0.98 and lo["session_keep"] == 1.0
    assert set(rn["reasons"]) <= {"session", "local", "spill", "wait_local", "queue_remote", "far", "rejected"}
    assert rn["reasons"]["spill"] > 0 and rn["reasons"]["session"] > rn["reasons"]["spill"]
    targets = bench_sites.targets(small_runs)
    assert targets["met"], targets


def test_without_a_hotspot_random_near_stays_local():
    cfg = SimConfig(duration_s=200.0, warmup_s=80.0, hotspot_factor=1.0, sites=30)
    rn = simulate(cfg, "random_near")
    assert rn["rejected"] == 0 and rn["forwarded_share"] < 0.03


def test_same_seed_same_result():
    cfg = SimConfig(sites=12, duration_s=150.0, warmup_s=50.0, hotspot="Paris", seed=3)
    assert simulate(cfg, "random_near") == simulate(cfg, "random_near")


def test_dead_site_drops_out_of_the_map_and_its_traffic_moves():
    cfg = SimConfig(duration_s=200.0, warmup_s=50.0, outage=("Amsterdam", 60.0, 1e9))
    sim = SiteSim(cfg, "random_near")
    out = sim.run()
    assert "Amsterdam" not in sim.latency.sites(cfg.duration_s)
    assert "Amsterdam" not in [n for n, _ in sim.latency.neighbours("London", cfg.duration_s)]
    assert not sim.views["Amsterdam"].alive
    # it drains what it ran at 60 s, then nothing; its own arrivals go to a neighbour; the
    # forwards sent on stale views and refused stay few (backoff, then expiry)
    assert out["utilisation"]["Amsterdam"] < 0.1 and out["rejected"] == 0
    assert 0 < out["refused_forwards"] < 30


def test_bench_main_prints_one_json_line_and_writes_out_and_plot(tmp_path, capsys):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    rc = bench_sites.main(["--sites", "12", "--hotspot", "Paris", "--duration", "120", "--warmup", "40",
                           "--out", str(out), "--plot", str(png)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["mode"] == "sim" and set(doc["policies"]) == {"random_near", "nearest_only", "local_only"}
    assert doc["config"]["sites"] == 12 and "met" in doc["targets"]
    assert json.loads(out.read_text())["policies"] == doc["policies"]
    assert png.stat().st_size > 10_000
    assert "sites" in BENCHES


def test_local_targets_judge_sessions_by_their_cached_share_against_one_site():
    from bench.sites.sites import targets

    def policy(rejected, util, keep, cached):
        return {"rejected": rejected, "util_max_over_mean": util, "session_keep": keep, "turn2_cached_share": cached,
                "added_rtt_ms": {"all_p50": 0.0}, "added_rtt_hops": {"forwarded_p50_fleet_hops": 1.0,
                                                                      "forwarded_p50_origin_hops": None}}
    runs = {"random_near": policy(4, 1.07, 0.96, 0.84), "nearest_only": policy(20, 1.6, 0.7, 0.66),
            "local_only": policy(150, 1.9, 1.0, 0.87)}
    t = targets(runs)
    assert t["met"] and t["turn2_cached_share_vs_single_site"] == pytest.approx(0.84 / 0.87, abs=1e-3)
    runs["random_near"] = policy(4, 1.07, 0.96, 0.80)  # 0.92 of the single site's
    assert not targets(runs)["session_keep_ok"]


def test_a_turn_at_its_site_queues_its_extra_places_beyond_the_bound():
    sim = SiteSim(SimConfig(sites=5, duration_s=10.0, warmup_s=0.0), "random_near")
    site, bound = sim.sites[0], sim.select.max_queue_wait_s
    site.busy = site.city.permits  # full; the queue admits while (queued + 1) * s / permits <= bound
    while site.wait_s(sim.cfg.service_s) <= bound:
        site.queue.append(None)
    assert not sim._admit(0, 0.0, (0, 0, 0.0))  # new work: refused
    assert sim._admit(0, 0.0, (0, 1, 0.0), extra_places=1)  # a turn: one place more
    assert not sim._admit(0, 0.0, (0, 1, 0.0), extra_places=1)  # ... and no further
    # the origin's own view for a turn there is judged with that place: within the bound again
    site.queue.pop()
    assert site.view(0.0, sim.cfg.service_s).queue_wait_s > bound
    assert site.view(0.0, sim.cfg.service_s, extra_places=1).queue_wait_s <= bound
