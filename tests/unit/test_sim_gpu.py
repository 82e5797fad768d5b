"""The timed executor's pure parts: the GPU profile and the modelled sequences (actors/sim/)."""

import json

import pytest

from actors.sim.profile import GpuProfile, StepShape
from actors.sim.sequences import NewSeq, Sequences


def _profile(tmp_path, **over):
    doc = {"name": "t", "block_size": 16, "num_gpu_blocks": 100, "max_num_seqs": 8, "max_num_batched_tokens": 256,
           "kv_bytes_per_token": 1000, "kv_transfer_bytes_per_s": 1e6, "step_overhead_s": 0.001,
           "prefill": {"context": [0, 1000], "s_per_token": [1e-5, 3e-5]},
           "decode": {"batch": [1, 10], "context": [100, 1100], "step_s": [[0.01, 0.02], [0.03, 0.05]]}}
    doc.update(over)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return GpuProfile.load(path)


def test_shipped_profile_loads_and_prices_a_decode_step_like_an_h100():
    p = GpuProfile.load()
    assert p.block_size == 16 and p.num_gpu_blocks > 10_000 and p.sources
    one = p.decode_s(1, 1024) + p.step_overhead_s
    assert 0.004 < one < 0.010  # published H100 8B ITL at batch 1: ~6-7 ms
    assert p.decode_s(256, 1024) > p.decode_s(64, 1024) > p.decode_s(1, 1024)
    assert p.prefill_s(0, 2048) > 2 * p.prefill_s(0, 1024) * 0.99


def test_interpolates_between_grid_points_and_clamps_outside(tmp_path):
    p = _profile(tmp_path)
    assert p.decode_s(1, 100) == pytest.approx(0.01)
    assert p.decode_s(1, 600) == pytest.approx(0.015)
    assert p.decode_s(5.5, 600) == pytest.approx((0.015 + 0.04) / 2)
    assert p.decode_s(50, 5000) == pytest.approx(0.05)  # clamped
    assert p.decode_s(0, 600) == 0.0
    assert p.prefill_s(0, 1000) == pytest.approx(1000 * 2e-5)  # priced at the chunk's middle
    assert p.prefill_s(10, 10) == 0.0
    assert p.kv_transfer_s(2000) == pytest.approx(2.0)


def test_step_adds_decode_prefill_and_overhead_and_a_transfer_takes_its_bytes_at_the_link_rate(tmp_path):
    p = _profile(tmp_path)
    assert p.step_s(StepShape()) == 0.0
    shape = StepShape(decode_ctx=[100, 1100], prefill=[(0, 500)])
    want = 0.001 + p.decode_s(2, 600) + 500 * p.prefill_s(0, 500) / 500
    assert p.step_s(shape) == pytest.approx(want)
    assert p.kv_transfer_s(1000) == pytest.approx(1.0) and p.kv_transfer_s(0) == 0.0  # 1 MB at 1 MB/s


@pytest.mark.parametrize("field,value,msg", [
    ("decode", {"batch": [1, 10], "context": [100, 1100], "step_s": [[0.02, 0.01], [0.03, 0.05]]}, "along context"),
    ("decode", {"batch": [10, 1], "context": [100, 1100], "step_s": [[0.01, 0.02], [0.03, 0.05]]}, "decode.batch"),
    ("prefill", {"context": [0, 1000], "s_per_token": [1e-5]}, "one value per context"),
])
def test_a_malformed_profile_names_its_file_and_grid(tmp_path, field, value, msg):
    with pytest.raises(ValueError, match=msg) as e:
        _profile(tmp_path, **{field: value})
    assert "p.json" in str(e.value)


def test_a_profile_missing_a_field_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="bad.json.*block_size"):
        GpuProfile.load(path)


def test_chunked_prefill_then_decode_then_finish():
    s = Sequences(vocab=1000)
    shape, done = s.plan([NewSeq("a", list(range(100)), 0)], {}, {"a": 64})
    assert shape.prefill == [(0, 64)] and not shape.decode_ctx and done == set()
    shape, done = s.plan([], {"a": 64}, {"a": 36})
    assert shape.prefill == [(64, 100)] and done == {"a"}
    s.draw("a")
    shape, done = s.plan([], {"a": 100}, {"a": 1})
    assert shape.decode_ctx == [101] and not shape.prefill and done == {"a"}
    s.plan([], {}, {}, finished={"a"})
    assert "a" not in s.seqs


def test_a_prefix_hit_starts_the_prompt_past_its_cached_tokens():
    s = Sequences(vocab=1000)
    shape, done = s.plan([NewSeq("a", list(range(100)), 96)], {}, {"a": 4})
    assert shape.prefill == [(96, 100)] and done == {"a"}


def test_a_resumed_request_recomputes_its_outputs_as_prompt():
    s = Sequences(vocab=1000)
    s.plan([NewSeq("a", list(range(10)), 0)], {}, {"a": 10})
    s.draw("a")
    s.draw("a")  # known 12: preempted after two tokens, resumed with 8 computed from cache
    shape, done = s.plan([], {"a": 8}, {"a": 4})
    assert shape.prefill == [(8, 12)] and done == {"a"}


def test_draws_are_seeded_by_prompt_or_seed_and_never_stop_tokens():
    def run(seed=None, stop=frozenset()):
        s = Sequences(vocab=50)
        s.plan([NewSeq("a", [1, 2, 3], 0, seed, set(stop))], {}, {"a": 3})
        return [s.draw("a") for _ in range(200)]

    assert run() == run()
    assert run(seed=7) == run(seed=7) != run(seed=8)
    assert not {0, 1, 2, 3} & set(run(stop={0, 1, 2, 3}))


def test_echo_copies_the_prompt_and_skips_stop_tokens():
    s = Sequences(vocab=50, echo=True)
    s.plan([NewSeq("a", [5, 6, 2, 7], 0, stop={2})], {}, {"a": 4})
    assert [s.draw("a") for _ in range(5)] == [5, 6, 7, 5, 6]


def test_a_grammar_picks_from_its_allowed_tokens_and_ends_on_stop_only_when_alone():
    s = Sequences(vocab=50)
    s.plan([NewSeq("a", [1], 0, stop={9})], {}, {"a": 1})
    assert {s.draw("a", [3, 4, 9]) for _ in range(30)} <= {3, 4}
    assert s.draw("a", [9]) == 9


def test_the_timed_store_gives_the_leading_run_below_the_requests_end():
    from actors.sim.timed_store import leading_hit

    assert leading_hit([True, True, False, True], 100, 16) == 32  # a gap ends the run: later blocks are no hit
    assert leading_hit([False, True], 100, 16) == 0
    assert leading_hit([True] * 6, 100, 16) == 96  # 100 tokens: 6 full blocks, the tail is computed
    assert leading_hit([True] * 6, 96, 16) == 80  # all of it held: the last block is computed, to sample
    assert leading_hit([True], 16, 16) == 0 and leading_hit([], 40, 16) == 0

