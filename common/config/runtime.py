"""The sections of the processes around the engines: tracing and Ray."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.config.base import _Strict


class TracingConfig(_Strict):
    exporter: Literal["none", "console", "file", "otlp"] = Field(
        "none", description="where request spans go"
    )
    file: str = Field(".baton/traces.jsonl", description="span file for exporter=file")
    otlp_endpoint: str = Field("http://127.0.0.1:4317", description="OTLP gRPC endpoint")


class RayConfig(_Strict):
    address: str | None = Field(None, description="existing Ray cluster; None starts a local head")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local head; None = all")
