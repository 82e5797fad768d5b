"""The `baton` object that every chat and completion response carries.

OpenAI's schema has no room for what Baton decided about a request, so each
response (and the usage chunk of a stream) adds one `baton` object: how the
request was routed, on which replicas it ran and how many prompt tokens each
side did not recompute. The ingress fills one `BatonInfo` per request as the
request moves along; `body()` is the one place it becomes JSON.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BatonInfo:
    """What Baton did with one request; optional fields are left out when unset."""

    # pinned | moved | prefix | load | round_robin | colocated | spill | fallback | no_replicas | model (a peer
    # replica that has the catalogue model resident)
    route: str | None = None
    decode_only: bool | None = None  # decode computed the prompt itself, no prefill step
    predicted_cached_tokens: int | None = None  # the index's guess for the computing replica
    prefill_replica: str | None = None
    decode_replica: str | None = None
    retried_after: str | None = None  # error type of a first attempt that failed before any token
    first_token: str | None = None  # "prefill": the prefill engine sampled the first token, decode went on
    # Prompt tokens the prefill engine found cached; None when no prefill ran.
    prefill_cached_tokens: int | None = None
    # Prompt tokens the decode engine did not compute: its own cache or loaded from Mooncake.
    decode_cached_tokens: int = 0
    # The router's cost (routing/policy/cost.py): predicted seconds until the prompt is computed on
    # the chosen replicas, and on the session's pinned ones (a move's "stay"); None where not priced.
    predicted_s: float | None = None
    stay_s: float | None = None
    moved: list | None = None  # pools whose session pin moved to another replica

    def cached_tokens(self) -> int:
        """OpenAI's `cached_tokens`: prompt tokens this request did not compute.

        The prefill engine's hit when a prefill ran; otherwise decode's. A decode
        replica loading KV that prefill just wrote is a transfer, not a hit.
        """
        return self.decode_cached_tokens if self.prefill_cached_tokens is None else self.prefill_cached_tokens

    def body(self) -> dict:
        """The JSON object; changes nothing."""
        out: dict = {}
        for key in ("route", "decode_only", "predicted_cached_tokens", "prefill_replica",
                    "decode_replica", "retried_after", "first_token", "predicted_s", "stay_s", "moved"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 4) if isinstance(value, float) else value
        out["prefill_cached_tokens"] = self.prefill_cached_tokens
        out["decode_cached_tokens"] = self.decode_cached_tokens
        return out
