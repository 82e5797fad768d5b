"""What one completion request carries from stage to stage (deployments/front/pipeline/flow.py)."""

from __future__ import annotations

import uuid

from pydantic_core import to_json

from common.constants import NO_LOOKUP, REQUEST_ID_HEADER, SESSION_HEADER
from common.response import BatonInfo
from deployments.api import apis
from deployments.front import first_token

_ID_PREFIX = {"chat": "chatcmpl", "text": "cmpl", "messages": "msg"}


class Request:
    """One request's state. Each stage sets its own fields; none but `engine_body` changes `body`
    after parse."""

    def __init__(self, scope: dict, receive, send, api: apis.Api):
        self.scope, self.receive, self.send, self.api = scope, receive, send, api
        self.kind = api.kind
        self.tenant = ""  # auth
        self.forwarded = False  # auth: admitted by another site, which sent it here
        self.raw: bytes | None = None  # the client's body, once read
        self.permit = None  # admission
        self.body: dict = {}  # parse: the client's body, validated (a Responses chain resolved)
        self.session: str | None = None  # parse: the session key (apis.session_of)
        self.app = None  # model: the app of its model in this process
        self.held_model: str | None = None  # model: a catalogue model acquired here, until finish
        self.route = None  # model or route: where it runs (request_routing.Route), None: here
        self.info = BatonInfo()  # what the answer's x-baton-info says
        self.request_id = ""  # route: the id the client sees
        self.response_headers: list = []
        self.ids: list[int] | None = None  # route: the rendered prompt's token ids
        self.first_token: int | None = None  # prefill: the token the stream began with
        self.store_lookup = True  # prefill: False where its KV saves did not drain (decode recomputes)
        self.stream = None  # route: relay.EarlyStream around `send`
        self.finished = False

    def identify(self) -> None:
        """Sets the request id (a Responses request's is its response id) and the headers every answer carries."""
        rid = self.body.get("request_id") or uuid.uuid4().hex
        self.body["request_id"] = rid
        self.request_id = rid if self.kind == "responses" else f"{_ID_PREFIX.get(self.kind, 'cmpl')}-{rid}"
        self.response_headers = [(REQUEST_ID_HEADER.encode(), self.request_id.encode())]
        if self.session:
            self.response_headers.append((SESSION_HEADER.encode(), self.session.encode()))

    def engine_body(self) -> bytes:
        """The body the engine gets, built here only: the client's, with the tenant as vLLM's
        `cache_salt`, the rendered prompt ids (chat and Messages in `kv_transfer_params`, so the
        engine does not tokenise again; a completion's prompt becomes the ids), and, when the
        prefill's token began the stream, the continuation after it, and `NO_LOOKUP` where
        the store is not to be asked (`store_lookup`). Changes `body`."""
        body = self.body
        body["cache_salt"] = self.tenant
        if self.ids is not None:
            if self.kind in ("chat", "messages"):
                body["kv_transfer_params"] = {"prompt_token_ids": self.ids}
            elif self.kind == "text":
                body["prompt"] = self.ids
        if not self.store_lookup:
            body["kv_transfer_params"] = {**(body.get("kv_transfer_params") or {}), NO_LOOKUP: True}
        if self.first_token is not None:
            first_token.continue_body(body, self.ids, self.first_token)
        return to_json(body)  # pydantic's Rust encoder: a 5k-token prompt's ids in a fraction of json.dumps's time
