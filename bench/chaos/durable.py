"""What must outlive a fault: batch lines and stored responses, made under the fault and counted after.

Beside the chat traffic, one fault's run keeps
- a Batch API job of `lines` chat lines, created a second before the kill
  so that lines are running when it comes, whose output and error files
  must end up holding every line exactly once;
- Responses-API chains: every `chain_every_s` a turn continues the last one
  (`previous_response_id`, stored by Baton); a chain whose turn failed
  starts again. Every response id the client was given must be readable
  after the run.

Both go through the official `openai` client, as a user's would. A line or
response missing after the run is lost; a line in the files twice is a
duplicate.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter

import openai

DONE = ("completed", "failed", "cancelled", "expired")


class Durable:
    """One fault's batch job and response chains; `report()` after the traffic ended."""

    def __init__(self, url: str, model: str, api_key: str | None = None, lines: int = 64,
                 chain_every_s: float = 0.5, max_tokens: int = 8):
        self.client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key or "unused", max_retries=0,
                                         timeout=30)
        self.model, self.lines, self.every, self.max_tokens = model, lines, chain_every_s, max_tokens
        self.batch_id: str | None = None
        self.batch_error: str | None = None
        self.responses: list[str] = []  # ids the client was given
        self.turns_failed = 0
        self.turn_errors: list[str] = []  # the first few failed turns' errors, for reading why

    async def start_batch(self, after_s: float = 0.0) -> None:
        """Uploads the input file and creates the batch `after_s` from now; notes why it could not."""
        await asyncio.sleep(after_s)
        rows = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0,
                                            "messages": [{"role": "user", "content": f"batch line {i}"}]}}) + "\n"
                       for i in range(self.lines))
        try:
            upload = await self.client.files.create(file=("chaos.jsonl", io.BytesIO(rows.encode())), purpose="batch")
            batch = await self.client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h")
            self.batch_id = batch.id
        except openai.OpenAIError as exc:
            self.batch_error = type(exc).__name__

    async def chains(self, seconds: float) -> None:
        """Responses-API turns every `chain_every_s` for `seconds`, each continuing the last answered."""
        previous, end = None, time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                r = await self.client.responses.create(
                    model=self.model, input=f"turn {len(self.responses)}", max_output_tokens=self.max_tokens,
                    temperature=0, previous_response_id=previous)
                self.responses.append(r.id)
                previous = r.id
            except openai.OpenAIError as exc:
                self.turns_failed += 1
                if len(self.turn_errors) < 3:
                    self.turn_errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                previous = None  # the chain starts again
            await asyncio.sleep(self.every)

    async def report(self, timeout_s: float) -> dict:
        """Waits (up to `timeout_s`) for the batch to finish, then counts what was lost or doubled."""
        lost_responses = 0
        for rid in self.responses:  # a Redis that kept nothing answers 404 for every one
            try:
                await self.client.responses.retrieve(rid)
            except openai.NotFoundError:
                lost_responses += 1
        out = {"responses_stored": len(self.responses), "responses_lost": lost_responses,
               "response_turns_failed": self.turns_failed, "response_turn_errors": self.turn_errors,
               "batch_lines": self.lines}
        out.update(await self._batch(timeout_s))
        await self.client.close()
        return out

    async def _batch(self, timeout_s: float) -> dict:
        if self.batch_id is None:
            return {"batch_status": f"not created ({self.batch_error})", "batch_lost": None,
                    "batch_duplicated": None}
        deadline = time.monotonic() + timeout_s
        try:
            batch = await self.client.batches.retrieve(self.batch_id)
            while batch.status not in DONE and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                batch = await self.client.batches.retrieve(self.batch_id)
        except openai.NotFoundError:  # the batch itself is gone (a Redis that kept nothing)
            return {"batch_status": "gone", "batch_lost": self.lines, "batch_duplicated": 0}
        if batch.status not in DONE:
            return {"batch_status": batch.status, "batch_lost": None, "batch_duplicated": None}
        seen: Counter = Counter()
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                text = (await self.client.files.content(file_id)).text
                seen.update(json.loads(row)["custom_id"] for row in text.splitlines() if row.strip())
        expected = {f"line-{i}" for i in range(self.lines)}
        return {"batch_status": batch.status, "batch_lost": len(expected - set(seen)),
                "batch_duplicated": sum(n - 1 for n in seen.values() if n > 1)}
