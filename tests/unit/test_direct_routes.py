"""DirectRoutes (actors/direct_routes.py): vLLM's generation routes called without the app's user
middleware or route matching, its exception handlers kept; everything else through the whole app."""

from __future__ import annotations

import argparse
import asyncio
import json

from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from actors.direct_routes import DirectRoutes


class Body(BaseModel):
    n: int


def _app(extra_middleware=None) -> tuple[FastAPI, list]:
    """A FastAPI app shaped like vLLM's: routes, handlers for validation and for any exception,
    CORS; `extra_middleware` a class of the caller's, which records the paths it sees."""
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(body: Body, raw: Request):
        if body.n < 0:
            raise RuntimeError("boom")
        return {"n": body.n, "state": raw.app.state.tag}

    @app.get("/v1/chat/completions")
    async def chat_get():
        return {"get": True}

    @app.post("/v1/other")
    async def other(body: Body):
        return {"other": body.n}

    @app.exception_handler(Exception)
    async def crashed(_request, exc):
        return JSONResponse({"error": {"message": str(exc), "code": 500}}, status_code=500)

    from fastapi.exceptions import RequestValidationError

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, _exc):
        return JSONResponse({"error": {"message": "bad body", "code": 400}}, status_code=400)

    app.add_middleware(CORSMiddleware, allow_origins=["*"])
    if extra_middleware is not None:
        app.add_middleware(extra_middleware, seen=seen)
    app.state.tag = "vllm"
    return app, seen


class Recording:
    """A user middleware DirectRoutes does not know: it must see every request."""

    def __init__(self, app, seen: list) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.seen.append(scope["path"])
        await self.app(scope, receive, send)


def _call(app, method: str, path: str, body: dict | None = None, origin: bool = True):
    """(status, headers, JSON body) of one request through the ASGI `app`."""
    raw = json.dumps(body).encode() if body is not None else b""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if origin:
        headers.append((b"origin", b"http://elsewhere.example"))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    sent, got = [], [False]

    async def receive():
        if not got[0]:
            got[0] = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def run():
        try:
            await app(scope, receive, send)
        except RuntimeError:  # re-raised after the error answer, as ServerErrorMiddleware does
            pass
    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_bytes = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), json.loads(body_bytes)


def test_a_generation_route_runs_without_the_user_middleware():
    app, _ = _app()
    direct = DirectRoutes(app, ["/v1/chat/completions"])
    assert set(direct.direct) == {"/v1/chat/completions"}
    status, headers, body = _call(direct, "POST", "/v1/chat/completions", {"n": 3})
    assert (status, body) == (200, {"n": 3, "state": "vllm"})  # `request.app` is the app
    assert b"access-control-allow-origin" not in headers  # CORS left out
    # through the whole app, the same request gets CORS's header: the middleware is really there
    status, headers, _ = _call(app, "POST", "/v1/chat/completions", {"n": 3})
    assert status == 200 and headers[b"access-control-allow-origin"] == b"*"


def test_the_apps_exception_handlers_still_answer():
    direct = DirectRoutes(_app()[0], ["/v1/chat/completions"])
    status, _, body = _call(direct, "POST", "/v1/chat/completions", {"m": 1})
    assert (status, body) == (400, {"error": {"message": "bad body", "code": 400}})
    status, _, body = _call(direct, "POST", "/v1/chat/completions", {"n": -1})
    assert (status, body) == (500, {"error": {"message": "boom", "code": 500}})


def test_other_paths_and_methods_go_through_the_whole_app():
    direct = DirectRoutes(_app()[0], ["/v1/chat/completions"])
    status, headers, body = _call(direct, "GET", "/v1/chat/completions")
    assert (status, body) == (200, {"get": True}) and b"access-control-allow-origin" in headers
    status, headers, body = _call(direct, "POST", "/v1/other", {"n": 2})
    assert (status, body) == (200, {"other": 2}) and b"access-control-allow-origin" in headers
    assert _call(direct, "POST", "/v1/missing", {"n": 2})[0] == 404


def test_an_unknown_middleware_keeps_every_request_in_the_whole_app():
    app, seen = _app(Recording)
    direct = DirectRoutes(app, ["/v1/chat/completions"])
    assert direct.direct == {}
    assert _call(direct, "POST", "/v1/chat/completions", {"n": 1})[0] == 200
    assert seen == ["/v1/chat/completions"]


def test_a_path_no_route_serves_is_left_to_the_app():
    assert DirectRoutes(_app()[0], ["/v1/nowhere"]).direct == {}


def test_vllms_own_app_takes_every_generation_route_directly():
    """vLLM's app as a replica builds it (no engine: its routes' handlers are not reached): its user
    middleware is the set DirectRoutes leaves out, and every route the Finisher finishes is found,
    so a vLLM upgrade that adds a middleware or moves a route shows here, not as a slower front."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.app import build_app

    from actors.finisher import FINISHED_PATHS
    from actors.openai_app import _engine_errors, frontend_args
    from common.config import BatonConfig

    args = argparse.Namespace(**(vars(frontend_args(BatonConfig())) | vars(AsyncEngineArgs(model="m"))))
    args.served_model_name = ["m"]
    app = build_app(args, ("generate",), None)
    _engine_errors(app)
    direct = DirectRoutes(app, FINISHED_PATHS)
    assert set(direct.direct) == set(FINISHED_PATHS)
    # a body vLLM's validation refuses gets vLLM's own 400, as through the whole app
    status, _, body = _call(direct, "POST", "/v1/chat/completions", {"messages": "not a list"}, origin=False)
    assert status == 400 and body["error"]["code"] == 400 and "messages" in body["error"]["message"]
    assert _call(app, "POST", "/v1/chat/completions", {"messages": "not a list"}, origin=False)[::2] == (status, body)
