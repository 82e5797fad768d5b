"""The Batch API (`batch:`): files and batches that run in the capacity interactive traffic leaves."""

from __future__ import annotations

from pydantic import Field

from common.config.base import _Strict


class BatchConfig(_Strict):
    tier: str | None = Field(None, description="admission tier batch lines run in; null: the lowest of "
                             "admission.tiers")
    max_in_flight: int = Field(4, ge=1, description="batch lines one front runs at once, at most")
    reserve_permits: int = Field(1, ge=0, description="a front starts a batch line only while this many "
                                 "of its engine permits stay free for interactive requests, and none queue")
    lease_s: float = Field(30.0, gt=0, description="a running line's claim; renewed while it runs, so a "
                           "line whose front died runs again elsewhere after this long")
    poll_s: float = Field(1.0, gt=0, description="how often an idle front looks for batch lines to run")
    max_file_bytes: int = Field(16 * 2**20, gt=0, description="largest file `POST /v1/files` takes")
    max_lines: int = Field(50_000, gt=0, description="most requests in one batch's input file")


class ResponsesConfig(_Strict):
    """The Responses API's stored responses (deployments/api/response_store.py)."""

    store_ttl_s: int = Field(30 * 86400, gt=0, description="how long a stored response (`store: true`, the "
                             "default) can be read or chained with previous_response_id")
    max_stored_bytes: int = Field(2**20, gt=0, description="largest conversation (input and output items) "
                                  "one stored response keeps; a longer one is answered but not stored")
