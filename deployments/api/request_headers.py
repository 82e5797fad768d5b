"""What a completion request's headers say: its tenant (API key), deadline and tier.

Each reader raises APIError (401 or 400, OpenAI's shape) for a header it cannot accept
and changes nothing.
"""

from __future__ import annotations

from actors.finisher import header
from common.constants import DEADLINE_HEADER, TIER_HEADER
from deployments.api.schemas import APIError


def tenant_of(scope, serve, keys) -> str:
    """The request's tenant, from its API key (deployments/api/api_keys.py `keys`); 401 if the key is wrong,
    or missing where `serve.require_api_key`. With no keys issued and none required, any key is anonymous."""
    auth = header(scope["headers"], b"authorization")
    # Anthropic's clients send their key as `x-api-key`.
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else header(scope["headers"], b"x-api-key").strip()
    if not token:
        if serve.require_api_key:
            raise APIError(401, "Missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)",
                           code="invalid_api_key")
        return serve.anonymous_tenant
    tenant = keys.tenant(token)
    if tenant is not None:
        return tenant
    if keys.empty and not serve.require_api_key:
        return serve.anonymous_tenant
    raise APIError(401, "Incorrect API key provided", code="invalid_api_key")


def deadline_of(scope) -> float | None:
    """Seconds by which the request should see its first token (its `x-baton-deadline-s`), if it says."""
    if not (raw := header(scope["headers"], DEADLINE_HEADER.encode())):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise APIError(400, f"{DEADLINE_HEADER} must be a number of seconds", param=DEADLINE_HEADER) from None
    if not 0 < value <= 3600:
        raise APIError(400, f"{DEADLINE_HEADER} must be in (0, 3600]", param=DEADLINE_HEADER)
    return value


def tier_of(scope, tiers) -> str | None:
    """The requested tier (admission lowers it to the tenant's if higher); 400 if not one of `tiers`."""
    raw = header(scope["headers"], TIER_HEADER.encode()) or None
    if raw is not None and raw not in tiers:
        raise APIError(400, f"{TIER_HEADER} must be one of {tiers}", param=TIER_HEADER)
    return raw
