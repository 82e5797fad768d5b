"""Stage 3, parse: the body against its API's strict schema, the model, the session.

Unknown fields are 400s in the API's own error shape (deployments/api/apis.py);
an unknown model is a 404. A Responses request's chain is resolved here
(deployments/api/responses_api.py), so the engine sees a stateless request.
"""

from __future__ import annotations

from actors.finisher import header
from common.constants import SESSION_HEADER
from deployments.api import apis
from deployments.api.schemas import APIError
from deployments.front.pipeline.request import Request


class Parse:
    """Validates a request's body; `known(model)` says which models this front serves."""

    def __init__(self, known, responses) -> None:
        self.known, self.responses = known, responses

    def validated(self, api: apis.Api, raw: bytes) -> dict:
        """The validated body as a dict; APIError(4xx) when it is not acceptable. Changes nothing."""
        body = apis.parse(api, raw)
        model = body["model"]
        if not self.known(model):
            raise APIError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")
        return body

    async def __call__(self, req: Request, raw: bytes) -> None:
        """Sets `req.body` and `req.session`; a Responses request gets its response id and the
        stored conversation it continues (404 when the tenant has no such response)."""
        req.body = self.validated(req.api, raw)
        req.session = apis.session_of(req.api, header(req.scope["headers"], SESSION_HEADER.encode()), req.body)
        if req.kind == "responses":
            req.session = await self.responses.chain(req.body, req.tenant, req.session)
