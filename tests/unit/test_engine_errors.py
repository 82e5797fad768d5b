"""The in-process vLLM app answers an engine's failure itself (actors/openai_app.py `_engine_errors`):
vLLM's own handler stops `vllm serve`'s uvicorn server, which Baton's app has not."""

from __future__ import annotations

from fastapi.testclient import TestClient

from actors.openai_app import _engine_errors
from common.constants import ENGINE_DEAD_RETRY_S


def _app(exc: Exception) -> TestClient:
    """vLLM's app as a replica builds it (its handlers, and its middleware built already), with a
    route that raises `exc`."""
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    app = build_app(make_arg_parser(FlexibleArgumentParser()).parse_args([]), ("generate",), None)

    @app.post("/boom")
    async def boom():
        raise exc

    _engine_errors(app)
    return TestClient(app, raise_server_exceptions=False)


def test_a_dead_engine_is_an_openai_style_503_with_retry_after():
    from vllm.v1.engine.exceptions import EngineDeadError

    r = _app(EngineDeadError()).post("/boom", json={})
    assert r.status_code == 503 and r.headers["retry-after"] == str(ENGINE_DEAD_RETRY_S)
    err = r.json()["error"]
    assert err["code"] == "engine_unavailable" and err["type"] == "server_error" and "param" in err


def test_a_failed_generation_is_answered_as_vllm_answers_it_without_a_server_to_stop():
    from vllm.v1.engine.exceptions import EngineGenerateError

    r = _app(EngineGenerateError()).post("/boom", json={})
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
