"""Every API agents speak takes one pipeline: chat, completions, Responses and
Anthropic Messages, through the official `openai` and `anthropic` clients, on
the shared disaggregated stack and on the routed colocated one.

For each path: a second tenant finds none of the first tenant's prompt
cached; each request is admitted once and billed exactly what its client
received; an overload gets 429s with Retry-After; a session keeps its
replica. Then the Responses chain across fronts, the Anthropic client's
whole surface, and default deny.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request

import httpx
import pytest

from tests.e2e import prompts
from tests.e2e.conftest import KEY_A, KEY_B
from tests.e2e.test_routing import EVENTS_SETTLE_S

MODEL = "baton-tiny"
GREEDY = {"temperature": 0}  # the current Anthropic client has no temperature argument; the API takes it
PATHS = ["chat", "completions", "responses", "messages"]


def _openai(stack, key):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=120)


def _anthropic(stack, key):
    from anthropic import Anthropic

    return Anthropic(base_url=stack.url, api_key=key, max_retries=0, timeout=120)


def send(stack, path: str, key: str, text: str, session: str | None = None, max_tokens: int = 4) -> dict:
    """One request on `path` through its official client: the usage its client received (prompt,
    completion and cached tokens) and Baton's `baton` object."""
    headers = {"x-session-affinity": session} if session else {}
    if path == "messages":
        meta = {}  # the session key rides in metadata.user_id, with no header
        r = _anthropic(stack, key).messages.create(
            model=MODEL, max_tokens=max_tokens, extra_body=GREEDY, messages=[{"role": "user", "content": text}],
            **({"metadata": {"user_id": session}} if session else meta))
        u = r.usage
        return {"prompt": _anthropic_prompt(u), "completion": u.output_tokens,
                "cached": u.cache_read_input_tokens or 0, "baton": r.model_extra["baton"]}
    client = _openai(stack, key)
    if path == "responses":
        r = client.responses.create(model=MODEL, input=text, max_output_tokens=max_tokens, temperature=0,
                                    extra_headers=headers)
        u = r.usage
        return {"prompt": u.input_tokens, "completion": u.output_tokens,
                "cached": u.input_tokens_details.cached_tokens, "baton": r.model_extra["baton"], "id": r.id}
    if path == "chat":
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                           max_tokens=max_tokens, temperature=0, extra_headers=headers)
    else:
        r = client.completions.create(model=MODEL, prompt=text, max_tokens=max_tokens, temperature=0,
                                      extra_headers=headers)
    u = r.usage
    return {"prompt": u.prompt_tokens, "completion": u.completion_tokens,
            "cached": u.prompt_tokens_details.cached_tokens, "baton": r.model_extra["baton"]}


def _anthropic_prompt(usage) -> int:
    """Anthropic's whole prompt: what was read from cache, written to it, and the rest."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def metric(stack, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`, from the pool's /metrics."""
    text = urllib.request.urlopen(f"{stack.url}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _text(tag: str) -> str:
    """A long prompt whose first block is its own (the tag leads), so that no earlier test's
    prompt, of either tenant, shares a prefix with it."""
    return f"Case {tag}. " + prompts.make(tag, 300)[1]["content"]


@pytest.fixture(params=["disaggregated", "colocated"])
def any_stack(request):
    return request.getfixturevalue("stack" if request.param == "disaggregated" else "colocated_stack")


@pytest.mark.parametrize("path", PATHS)
def test_a_second_tenant_finds_none_of_the_first_tenants_prompt(any_stack, path):
    text = _text(f"salt-{path}-{id(any_stack)}")
    send(any_stack, path, KEY_A, text)
    time.sleep(EVENTS_SETTLE_S)
    again = send(any_stack, path, KEY_A, text)
    other = send(any_stack, path, KEY_B, text)
    assert again["cached"] > 0, again  # the same tenant's repeat hits: the check below can fail
    assert other["cached"] == 0, other


@pytest.mark.parametrize("path", PATHS)
def test_each_request_is_admitted_once_and_billed_what_its_client_got(any_stack, path):
    before = {k: metric(any_stack, "baton_usage_tokens_total", tenant="tenant-b", kind=k)
              for k in ("prompt", "completion", "cached")}
    admitted = metric(any_stack, "baton_admitted_total", tenant="tenant-b")
    got = [send(any_stack, path, KEY_B, _text(f"bill-{path}-{i}"), max_tokens=3 + i) for i in range(3)]
    assert metric(any_stack, "baton_admitted_total", tenant="tenant-b") - admitted == 3
    for kind in ("prompt", "completion", "cached"):
        billed = metric(any_stack, "baton_usage_tokens_total", tenant="tenant-b", kind=kind) - before[kind]
        assert billed == sum(g[kind] for g in got), (kind, got)


def _raw(path: str, text: str, max_tokens: int) -> tuple[str, dict]:
    if path == "messages":
        return "/v1/messages", {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
    if path == "responses":
        return "/v1/responses", {"model": MODEL, "input": text, "max_output_tokens": max_tokens, "store": False}
    if path == "chat":
        return "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}],
                                        "max_tokens": max_tokens}
    return "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": max_tokens}


@pytest.mark.parametrize("path", PATHS)
def test_a_tenfold_overload_gets_429s_with_retry_after(stack, path):
    """40 at once against 4 permits, with a 1 s deadline: the excess is refused at once, never a 5xx."""
    url, body = _raw(path, "overload " * 40, 24)
    body = {**body, **({"ignore_eos": True} if path in ("chat", "completions") else {})}
    headers = {"authorization": f"Bearer {KEY_A}", "x-baton-deadline-s": "1"}

    async def main():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as c:
            return await asyncio.gather(*(c.post(f"{stack.url}{url}", json=body, headers=headers) for _ in range(40)))
    out = asyncio.run(main())
    statuses = sorted({r.status_code for r in out})
    assert set(statuses) <= {200, 429}, statuses
    refused = [r for r in out if r.status_code == 429]
    assert refused and all(int(r.headers["retry-after"]) >= 1 for r in refused)
    if path == "messages":  # in Anthropic's error shape
        assert refused[0].json()["type"] == "error" and refused[0].json()["error"]["type"] == "rate_limit_error"
    else:
        assert refused[0].json()["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("path", PATHS)
def test_a_session_keeps_its_replica(any_stack, path):
    session = f"agent-{path}-{id(any_stack)}"
    seen = [send(any_stack, path, KEY_A, _text(f"session-{path}") + f" turn {i}", session=session)["baton"]
            for i in range(3)]
    assert len({b["decode_replica"] for b in seen}) == 1, seen
    assert [b["route"] for b in seen[1:]] == ["pinned", "pinned"], seen


def _respond(stack, stream: bool, **kw):
    """One Responses turn on a new client (a new connection); a streamed one's final response."""
    client = _openai(stack, KEY_A)
    if not stream:
        return client.responses.create(model=MODEL, max_output_tokens=4, temperature=0, **kw)
    events = list(client.responses.create(model=MODEL, max_output_tokens=4, temperature=0, stream=True, **kw))
    assert events[0].type == "response.created", events[0]
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    return events[-1].response


def test_previous_response_id_chains_across_fronts_and_finds_its_prefix(stack):
    """Each turn on a new connection (the kernel spreads them over the fronts): the chain is
    found in Redis, routed to its replica, and the chained turn's prompt is mostly cached."""
    first = _respond(stack, False, input=_text("chain"))
    previous, replicas = first, {first.model_extra["baton"]["decode_replica"]}
    for turn in range(3):
        time.sleep(EVENTS_SETTLE_S)
        # The middle turn streams: a streamed response is stored and chained as well.
        r = _respond(stack, turn == 1, input=f"and turn {turn}?", previous_response_id=previous.id)
        assert r.usage.input_tokens > previous.usage.input_tokens  # the whole conversation was sent
        assert r.usage.input_tokens_details.cached_tokens >= previous.usage.input_tokens // 2, r.usage
        replicas.add(r.model_extra["baton"]["decode_replica"])
        previous = r
    assert len(replicas) == 1, replicas
    got = _openai(stack, KEY_A).responses.retrieve(previous.id)
    assert got.id == previous.id and got.output_text == previous.output_text
    from openai import NotFoundError

    with pytest.raises(NotFoundError):  # another tenant's id is not found
        _openai(stack, KEY_B).responses.retrieve(previous.id)
    with pytest.raises(NotFoundError):
        _openai(stack, KEY_B).responses.create(model=MODEL, input="x", previous_response_id=previous.id)


WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
    "required": ["city"], "additionalProperties": False}}


def test_the_anthropic_client_creates_streams_and_uses_tools(stack):
    client = _anthropic(stack, KEY_A)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    made = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=ask)
    assert made.type == "message" and made.role == "assistant" and made.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=ask) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop", events
    assert "message_delta" in events and final.usage.output_tokens > 0
    assert final.content[0].text == made.content[0].text  # greedy: the same answer either way
    forced = client.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=ask, tools=[WEATHER],
                                    tool_choice={"type": "tool", "name": "get_weather"})
    use = next(b for b in forced.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Rome", "Oslo"), forced.content
    after = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, tools=[WEATHER], messages=ask + [
        {"role": "assistant", "content": [b.model_dump() for b in forced.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]}])
    assert after.stop_reason in ("end_turn", "max_tokens") and _anthropic_prompt(after.usage) > \
        _anthropic_prompt(made.usage)  # the tool use and its result were in the prompt
    counted = client.messages.count_tokens(model=MODEL, messages=ask)
    assert counted.input_tokens > 0


def test_unknown_fields_are_400s_in_each_apis_shape(stack):
    headers = {"authorization": f"Bearer {KEY_A}"}
    for path in PATHS:
        url, body = _raw(path, "hi", 2)
        r = httpx.post(f"{stack.url}{url}", json={**body, "cache_salt": "someone-elses"}, headers=headers,
                       timeout=30)
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert "cache_salt" in err["message"], r.text
        if path == "messages":
            assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("route", ["/v1/chat/completions/batch", "/v1/chat/completions/render",
                                   "/v1/responses/render", "/v1/messages/render", "/inference/v1/generate",
                                   "/v1/systemone", "/v1/no-such-route", "/v1/load_lora_adapter"])
def test_engine_routes_baton_does_not_serve_are_404s(stack, route):
    r = httpx.post(f"{stack.url}{route}", json={"model": MODEL}, headers={"authorization": f"Bearer {KEY_A}"},
                   timeout=30)
    assert r.status_code == 404, r.text


def test_langchain_s_forced_tool_call_works_on_the_default_model(stack):
    """A client Baton did not write: LangChain's `bind_tools` with a forced tool, plainly asked. The
    grammar has no free whitespace, so the copying model cannot pad the arguments until max_tokens."""
    from langchain_openai import ChatOpenAI

    get_weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                    "parameters": WEATHER["input_schema"]}}
    llm = ChatOpenAI(base_url=f"{stack.url}/v1", api_key=KEY_A, model=MODEL, temperature=0, max_tokens=40,
                     max_retries=0, timeout=120)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"], msg
    assert msg.tool_calls[0]["args"]["city"] in ("Paris", "Rome", "Oslo"), msg.tool_calls


def test_metrics_carry_each_replicas_vllm_engine_series(stack):
    """A dashboard built for `vllm serve` finds its series, one per decode replica (the shared stack
    turns `serve.engine_metrics` on, as GPU engines have it by default)."""
    text = urllib.request.urlopen(f"{stack.url}/metrics", timeout=10).read().decode()
    for series in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total"):
        replicas = set(re.findall(rf'^{series}\{{[^}}]*replica="([^"]+)"', text, re.M))
        assert len(replicas) == 2, (series, replicas)
    assert metric(stack, "vllm:prefix_cache_hits_total") > 0  # the tests above repeated prompts
