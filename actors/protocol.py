"""The contract between the ingress and the engine replicas.

Plain dataclasses, pickled by Ray: what the ingress asks an engine to do, and
what comes back. No vLLM import here, so the ingress stays light.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingSpec:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    cache_salt: str | None = None
    trace_context: dict[str, str] = field(default_factory=dict)
    # Replica id chosen by Baton's router; read by deployments/replica_router.py.
    target_replica: str | None = None


@dataclass
class PrefillResult:
    request_id: str
    prompt_tokens: int
    num_cached_tokens: int
    replica: str


@dataclass
class EngineChunk:
    """One streamed delta from a decode replica.

    `num_cached_tokens` is what the engine reports for the prompt: tokens not
    recomputed, loaded from its own prefix cache or from Mooncake.
    """

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    num_cached_tokens: int = 0
    replica: str = ""
