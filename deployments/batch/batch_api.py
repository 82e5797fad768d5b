"""OpenAI's Files and Batch API on the public front: `/v1/files` and `/v1/batches`.

- `POST /v1/files` (multipart: `file`, `purpose=batch`), `GET /v1/files`,
  `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`;
- `POST /v1/batches` (`input_file_id`, `endpoint`, `completion_window`,
  `metadata`), `GET /v1/batches` (`limit`, `after`), `GET /v1/batches/{id}`,
  `POST /v1/batches/{id}/cancel`.

Every object belongs to the tenant whose key made it; another tenant's id is
a 404, as an unknown one is. A batch's input is checked line by line when
it is created: a file with bad lines makes a batch that is `failed` at once,
its `errors` naming each line. A good one is `in_progress` until the fronts'
runners (deployments/batch/batch_runner.py) have run every line; its output and
error files are then files of the same tenant, in OpenAI's shapes, so the
official `openai` client's batch calls work unchanged. State lives in Redis
(deployments/batch/batch_store.py): a front that restarts loses nothing.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import parse_qs

from actors.finisher import header
from common.config import BatonConfig
from deployments.batch.batch_store import BatchStore, new_id
from deployments.api.bodies import read_body
from deployments.api.bodies import respond
from deployments.api.schemas import APIError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")  # as OpenAI's Batch API
WINDOW_S = {"24h": 24 * 3600}
_FILE = re.compile(r"^/v1/files/([A-Za-z0-9_-]+)(/content)?$")
_BATCH = re.compile(r"^/v1/batches/([A-Za-z0-9_-]+)(/cancel)?$")
_INTERNAL = ("tenant", "expiring")


def public(batch: dict) -> dict:
    """The batch object as OpenAI shows it (internal fields dropped)."""
    return {k: v for k, v in batch.items() if k not in _INTERNAL}


def parse_lines(data: bytes, endpoint: str, max_lines: int) -> tuple[list[str], list[dict]]:
    """The input file's requests (one JSON text each) and the errors of its bad lines."""
    lines, errors, ids = [], [], set()
    for i, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        why = None
        try:
            req = json.loads(raw)
        except ValueError:
            req, why = None, "is not JSON"
        if why is None and not isinstance(req, dict):
            why = "must be a JSON object"
        elif why is None:
            cid = req.get("custom_id")
            if not isinstance(cid, str) or not cid:
                why = "needs a string custom_id"
            elif cid in ids:
                why = f"repeats custom_id {cid!r}"
            elif req.get("method") != "POST" or req.get("url") != endpoint:
                why = f"must be method POST and url {endpoint} (the batch's endpoint)"
            elif not isinstance(req.get("body"), dict):
                why = "needs a JSON object body"
            ids.add(cid)
        if why:
            errors.append({"code": "invalid_request", "message": f"line {i} {why}", "param": None, "line": i})
        else:
            lines.append(json.dumps({k: req[k] for k in ("custom_id", "method", "url", "body")}))
    if len(lines) > max_lines:
        errors.append({"code": "too_many_requests", "message": f"more than {max_lines} requests (batch.max_lines)",
                       "param": None, "line": None})
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "the input file has no requests", "param": None, "line": None})
    return lines, errors[:100]


class BatchAPI:
    """The `/v1/files` and `/v1/batches` routes of one front."""

    def __init__(self, cfg: BatonConfig, store: BatchStore) -> None:
        self.cfg, self.store = cfg, store

    async def handle(self, scope, receive, send, tenant: str) -> None:
        """Answers one Files or Batch API request of `tenant`; raises APIError for a 4xx."""
        path, method = scope["path"].rstrip("/"), scope["method"]
        if path == "/v1/files" and method in ("POST", "GET"):
            if method == "GET":
                purpose = parse_qs(scope.get("query_string", b"").decode()).get("purpose", [None])[0]
                return await respond(send, 200, {"object": "list", "data": await self.store.files(tenant, purpose),
                                                 "has_more": False})
            return await respond(send, 200, await self._upload(scope, receive, tenant))
        if m := _FILE.match(path):
            return await self._file(send, method, m.group(1), bool(m.group(2)), tenant)
        if path == "/v1/batches" and method == "POST":
            return await respond(send, 200, public(await self._create(receive, tenant)))
        if path == "/v1/batches" and method == "GET":
            return await respond(send, 200, await self._list(scope, tenant))
        if (m := _BATCH.match(path)) and (method == "GET") != bool(m.group(2)):
            batch = await self.store.batch(m.group(1), tenant)
            if batch is None:
                raise APIError(404, f"No batch found with id '{m.group(1)}'.", code="batch_not_found")
            if m.group(2):
                batch = await self._cancel(batch)
            return await respond(send, 200, public(batch))
        raise APIError(404 if method in ("GET", "POST", "DELETE") else 405, f"no route {method} {path}",
                       code="not_found")

    async def _upload(self, scope, receive, tenant: str) -> dict:
        from starlette.requests import Request

        length = header(scope["headers"], b"content-length")
        if not length.isdigit():
            raise APIError(411, "a file upload needs a Content-Length")
        if int(length) > self.cfg.batch.max_file_bytes + 65536:
            raise APIError(413, f"files are at most {self.cfg.batch.max_file_bytes} bytes (batch.max_file_bytes)",
                           code="file_too_large")
        try:
            form = await Request(scope, receive).form(max_files=1, max_fields=8)
        except Exception as exc:  # noqa: BLE001 - starlette's parser raises several kinds for bad input
            raise APIError(400, f"the body must be multipart/form-data with `file` and `purpose`: {exc}") from None
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            raise APIError(400, "purpose must be 'batch' (the only purpose Baton stores files for)", param="purpose")
        if upload is None or isinstance(upload, str):
            raise APIError(400, "the form needs a `file` part", param="file")
        data = await upload.read()
        if len(data) > self.cfg.batch.max_file_bytes:
            raise APIError(413, f"files are at most {self.cfg.batch.max_file_bytes} bytes", code="file_too_large")
        return await self.store.put_file(tenant, upload.filename or "upload.jsonl", purpose, data)

    async def _file(self, send, method: str, file_id: str, content: bool, tenant: str) -> None:
        if method == "DELETE" and not content:
            if not await self.store.delete_file(tenant, file_id):
                raise APIError(404, f"No such File object: {file_id}", code="file_not_found")
            return await respond(send, 200, {"id": file_id, "object": "file", "deleted": True})
        if method != "GET":
            raise APIError(405, f"{method} is not allowed here")
        meta = await self.store.file(tenant, file_id)
        if meta is None:
            raise APIError(404, f"No such File object: {file_id}", code="file_not_found")
        if content:
            return await respond(send, 200, await self.store.file_data(tenant, file_id) or b"",
                                 content_type=b"application/octet-stream")
        return await respond(send, 200, meta)

    async def _create(self, receive, tenant: str) -> dict:
        try:
            body = json.loads(await read_body(receive, 1 << 20))
        except ValueError:
            raise APIError(400, "the body must be JSON") from None
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object")
        endpoint, window, fid = body.get("endpoint"), body.get("completion_window"), body.get("input_file_id")
        if endpoint not in ENDPOINTS:
            raise APIError(400, f"endpoint must be one of {list(ENDPOINTS)}", param="endpoint")
        if window not in WINDOW_S:
            raise APIError(400, f"completion_window must be one of {list(WINDOW_S)}", param="completion_window")
        if not isinstance(body.get("metadata") or {}, dict):
            raise APIError(400, "metadata must be an object", param="metadata")
        meta = await self.store.file(tenant, fid) if isinstance(fid, str) else None
        if meta is None or meta["purpose"] != "batch":
            raise APIError(404, f"No such File object: {fid}", param="input_file_id", code="file_not_found")
        lines, errors = parse_lines(await self.store.file_data(tenant, fid) or b"", endpoint, self.cfg.batch.max_lines)
        now = int(time.time())
        batch = {"id": new_id("batch_"), "object": "batch", "endpoint": endpoint, "errors": None,
                 "input_file_id": fid, "completion_window": window, "status": "in_progress",
                 "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": now,
                 "expires_at": now + WINDOW_S[window], "finalizing_at": None, "completed_at": None,
                 "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                 "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                 "metadata": body.get("metadata")}
        if errors:
            batch.update(status="failed", failed_at=now, in_progress_at=None, errors={"object": "list", "data": errors})
            lines = []
        await self.store.create_batch(tenant, batch, lines)
        return batch

    async def _list(self, scope, tenant: str) -> dict:
        q = parse_qs(scope.get("query_string", b"").decode())
        try:
            limit = int(q.get("limit", ["20"])[0])
        except ValueError:
            raise APIError(400, "limit must be an integer", param="limit") from None
        if not 1 <= limit <= 100:
            raise APIError(400, "limit must be between 1 and 100", param="limit")
        ids = await self.store.batches(tenant)
        if after := q.get("after", [None])[0]:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        page = [public(b) for i in ids[:limit] if (b := await self.store.batch(i, tenant)) is not None]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(ids) > limit}

    async def _cancel(self, batch: dict) -> dict:
        """Stops a batch's unstarted lines; the runners end it `cancelled` once its running ones finish."""
        if batch["status"] in ("in_progress", "validating"):
            batch.update(status="cancelling", cancelling_at=int(time.time()))
            await self.store.save_batch(batch)
            await self.store.drop_todo(batch["id"])
        return batch
