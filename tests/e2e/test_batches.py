"""The Batch API through the official `openai` client, unchanged, on the shared stack."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from tests.e2e.conftest import KEY_B


def _lines(rows: list[tuple[str, dict]], url: str = "/v1/chat/completions") -> bytes:
    return "".join(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})
                   + "\n" for cid, body in rows).encode()


def _chat(text: str, model: str = "baton-tiny") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0}


def _wait(client, batch_id: str, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.5)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


@pytest.fixture(scope="module")
def other(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY_B, max_retries=0, timeout=60)


def test_a_batch_runs_its_lines_and_returns_output_and_error_files(client, other):
    rows = [("hello", _chat("hello there")), ("again", _chat("hello again")),
            ("nobody", _chat("who?", model="no-such-model"))]
    upload = client.files.create(file=("in.jsonl", io.BytesIO(_lines(rows))), purpose="batch")
    assert upload.bytes > 0 and upload.purpose == "batch"
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "e2e"})
    assert batch.status == "in_progress" and batch.request_counts.total == 3
    batch = _wait(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert {r["custom_id"] for r in out} == {"hello", "again"}
    for r in out:
        body = r["response"]["body"]
        assert r["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["usage"]["completion_tokens"] == 8
    [err] = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert err["custom_id"] == "nobody" and err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["code"] == "model_not_found"
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]
    # Another tenant sees neither the batch nor its files.
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(batch.output_file_id)
    assert batch.id not in [b.id for b in other.batches.list().data]


def test_an_input_file_with_bad_lines_makes_a_failed_batch_naming_them(client):
    good = _lines([("ok", _chat("fine"))])
    upload = client.files.create(file=("bad.jsonl", io.BytesIO(good + b"{not json\n" + good)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "invalid_request"), (3, "invalid_request")]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")


def test_a_cancelled_batch_runs_no_more_lines_and_keeps_what_finished(client):
    rows = [(f"c{i}", _chat(f"cancel me {i}")) for i in range(40)]
    upload = client.files.create(file=("many.jsonl", io.BytesIO(_lines(rows))), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = _wait(client, batch.id)
    assert batch.status == "cancelled" and batch.request_counts.completed < 40
    if batch.request_counts.completed:
        done = client.files.content(batch.output_file_id).text.splitlines()
        assert len(done) == batch.request_counts.completed


def test_a_responses_batch_runs_its_lines_as_the_responses_api(client):
    """OpenAI's Batch API takes /v1/responses lines too; each runs through the same pipeline."""
    rows = [(f"r{i}", {"model": "baton-tiny", "input": f"respond {i}", "max_output_tokens": 5, "temperature": 0})
            for i in range(2)]
    upload = client.files.create(file=("resp.jsonl", io.BytesIO(_lines(rows, "/v1/responses"))), purpose="batch")
    batch = _wait(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/responses",
                                                completion_window="24h").id)
    assert batch.status == "completed" and batch.request_counts.completed == 2, batch
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    for r in out:
        body = r["response"]["body"]
        assert body["object"] == "response" and body["status"] == "incomplete", body  # cut at max_output_tokens
        assert body["usage"]["output_tokens"] <= 5 and body["output"], body
