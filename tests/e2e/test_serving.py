"""End-to-end: prefill -> KV over Mooncake -> decode, through the OpenAI API."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.e2e import prompts

BLOCK = 32  # model.block_size in the default config


def full_blocks(prompt_len: int) -> int:
    # vLLM always computes the last prompt token, so a block-aligned prompt
    # can reuse one block less.
    return (prompt_len - 1) // BLOCK * BLOCK


@pytest.mark.parametrize("name", list(prompts.LENGTHS))
def test_non_streaming_matches_colocated_engine(client, reference, name):
    ref = reference[f"plain/{name}"]
    resp = client.chat.completions.create(
        model="baton-tiny", messages=prompts.cases("plain")[name], max_tokens=prompts.MAX_TOKENS,
        temperature=0, extra_body={"return_token_ids": True})
    choice = resp.choices[0]
    assert choice.model_extra["token_ids"] == ref["token_ids"]
    assert resp.usage.prompt_tokens == len(ref["prompt_ids"])
    assert resp.usage.completion_tokens == len(ref["token_ids"])
    assert choice.finish_reason in ("length", "stop")
    # Decode never saw this prompt: its cached tokens came from Mooncake.
    baton = resp.model_extra["baton"]
    assert baton["decode_cached_tokens"] == full_blocks(len(ref["prompt_ids"]))
    assert baton["decode_only"] is (name == "short")


@pytest.mark.parametrize("name", list(prompts.LENGTHS))
def test_streaming_matches_colocated_engine(client, reference, name):
    ref = reference[f"stream/{name}"]
    stream = client.chat.completions.create(
        model="baton-tiny", messages=prompts.cases("stream")[name], max_tokens=prompts.MAX_TOKENS,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"return_token_ids": True})
    tokens, text, usage, finish, baton = [], "", None, None, None
    for chunk in stream:
        if chunk.usage:
            usage, baton = chunk.usage, chunk.model_extra["baton"]
        for c in chunk.choices:
            tokens += (c.model_extra or {}).get("token_ids", [])
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert tokens == ref["token_ids"]
    assert finish in ("length", "stop")
    assert usage.completion_tokens == len(ref["token_ids"])
    assert baton["decode_cached_tokens"] == full_blocks(len(ref["prompt_ids"]))


@pytest.mark.parametrize("name", ["medium", "long"])
def test_a_plain_stream_takes_its_first_token_from_prefill_and_matches(client, reference, name):
    """A streamed chat request without tools, logprobs or token ids gets the prefill
    engine's token first; the whole answer and its usage are what the unsplit
    path gives (the reference engine's tokens)."""
    ref, messages = reference[f"first/{name}"], prompts.cases("first")[name]
    stream = client.chat.completions.create(
        model="baton-tiny", messages=messages, max_tokens=prompts.MAX_TOKENS, temperature=0,
        stream=True, stream_options={"include_usage": True})
    roles, text, usage, baton, finish = [], "", None, None, None
    for chunk in stream:
        if chunk.usage:
            usage, baton = chunk.usage, chunk.model_extra["baton"]
        for c in chunk.choices:
            roles += [c.delta.role] if c.delta.role else []
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert baton["first_token"] == "prefill" and baton["decode_only"] is False
    assert roles == ["assistant"]
    assert usage.prompt_tokens == len(ref["prompt_ids"])
    assert usage.completion_tokens == len(ref["token_ids"])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # Decode loaded the prompt's blocks that the prefill saved, and computed the rest.
    assert baton["decode_cached_tokens"] >= full_blocks(len(ref["prompt_ids"]))
    whole = client.chat.completions.create(
        model="baton-tiny", messages=messages, max_tokens=prompts.MAX_TOKENS, temperature=0,
        extra_body={"return_token_ids": True})
    assert whole.choices[0].model_extra["token_ids"] == ref["token_ids"]
    assert text == whole.choices[0].message.content and finish == whole.choices[0].finish_reason


def test_completions_endpoint_and_sampling_params(client):
    out = client.completions.create(model="baton-tiny", prompt="The river runs", max_tokens=5,
                                    temperature=0.8, top_p=0.9, seed=7)
    again = client.completions.create(model="baton-tiny", prompt="The river runs", max_tokens=5,
                                      temperature=0.8, top_p=0.9, seed=7)
    assert out.choices[0].text == again.choices[0].text  # seeded sampling is reproducible
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="baton-tiny", prompt="The river runs",
                                            max_tokens=3, stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].text is not None) >= 1


def test_stop_sequence_ends_generation(client):
    first = client.completions.create(model="baton-tiny", prompt="Pack my box", max_tokens=8,
                                      temperature=0)
    text = first.choices[0].text
    # A plain-ASCII piece after the first character, so the match is exact.
    start = next(i for i in range(1, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].strip())
    stop = text[start:start + 2]
    out = client.completions.create(model="baton-tiny", prompt="Pack my box", max_tokens=8,
                                    temperature=0, stop=[stop])
    assert out.choices[0].finish_reason == "stop"
    assert stop not in out.choices[0].text


def test_models_and_health(client, stack):
    assert [m.id for m in client.models.list().data] == ["baton-tiny"]
    with urllib.request.urlopen(f"{stack.url}/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}


def test_spans_cover_the_request_path(stack, client):
    resp = client.chat.completions.create(
        model="baton-tiny", messages=prompts.make("trace", 120), max_tokens=2)
    wanted = {"ingress", "prefill", "kv_load", "decode"}
    deadline = time.monotonic() + 10  # each process appends its own spans
    while True:
        lines = (stack.config.parent / "traces.jsonl").read_text().splitlines()
        spans = [json.loads(line) for line in lines]
        mine = {s["name"]: s for s in spans if s["attributes"].get("baton.request_id") == resp.id}
        if wanted <= set(mine) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert wanted <= set(mine)
    assert len({s["context"]["trace_id"] for s in mine.values()}) == 1


def test_status_reports_every_component_healthy(stack):
    out = stack.baton("status", "--json")
    report = json.loads(out.stdout)
    names = {c["name"]: c["state"] for c in report["components"]}
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("redis", "mooncake", "ray", "pool:prefill", "pool:decode", "endpoint"):
        assert names[name] == "healthy"
    # each routed engine, with its load and the rates the router prices it with
    assert {n.split(":")[0] for n in names if n.startswith(("prefill:", "decode:"))} == {"prefill", "decode"}


def test_prefill_hands_over_when_the_worker_says_its_kv_is_saved(stack):
    """The prefill replica learns that a request's KV is in Mooncake from its
    worker's push (actors/save_watch.py), not by asking again and again: no
    wait ends on the 0.5 s recheck, as every save still queued at the first
    question would without the push."""
    import random

    import httpx
    import redis

    entries = redis.Redis.from_url(stack.cfg["redis"]["url"]).hgetall("baton:replicas:prefill")
    url = json.loads(next(iter(entries.values())))["url"]
    rng = random.Random(7)
    for i in range(6):
        ids = [rng.randrange(100, 1000) for _ in range(300 + 40 * i)]  # the model has 1024 tokens
        r = httpx.post(f"{url}/baton/prefill", json={"prompt_token_ids": ids, "cache_salt": "drain-test"},
                       timeout=60)
        assert r.status_code == 200, r.text
        res = r.json()
        assert res["prompt_tokens"] == len(ids)
        assert res["drain_end"] in ("none_left", "push"), res
        assert res["drain_s"] < 0.4, res
    bad = httpx.post(f"{url}/baton/prefill", json={"prompt_token_ids": [5000] * 20}, timeout=60)
    assert bad.status_code == 400 and "vocabulary" in bad.text, bad.text
