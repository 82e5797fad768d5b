"""Names and paths every layer agrees on, defined once.

HTTP headers clients and the ingress exchange, the Serve application name,
the pseudo-replica that stands for the Mooncake store in the prefix index,
and the repository paths of the default model, the word corpus and the
conversation trace.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The default model: the tiny Llama trained to copy (cluster/default_model/train_copy.py), committed with the
# marker that records its inputs; `baton model` retrains it only if they changed.
DEFAULT_MODEL_DIR = REPO_ROOT / "models" / "baton-tiny-copy"
DRAFT_MODEL_DIR = REPO_ROOT / "models" / "baton-tiny-copy-draft"  # its draft, for `speculation.method: draft`
EAGLE_MODEL_DIR = REPO_ROOT / "models" / "baton-tiny-copy-eagle"  # its EAGLE head (cluster/default_model/train_eagle.py)
# Text the tiny model's tokenizer is trained on; benchmarks draw prompt words from it.
CORPUS = Path(__file__).resolve().parent / "assets" / "corpus.txt"
# The Mooncake FAST'25 conversation trace (Apache-2.0, see bench/traces/NOTICE).
TRACE = REPO_ROOT / "bench" / "traces" / "mooncake_conversation_trace.jsonl"
# Tokens per hash id in that trace.
TRACE_BLOCK_TOKENS = 512

APP_NAME = "baton"  # the Serve application
RAY_NAMESPACE = "baton"

SESSION_HEADER = "x-session-affinity"  # multi-turn session id, echoed back
DEADLINE_HEADER = "x-baton-deadline-s"  # by when one request must see its first token
TIER_HEADER = "x-baton-tier"  # priority tier of one request (interactive, batch)
REQUEST_ID_HEADER = "x-baton-request-id"
DEFAULT_TENANT = "default"  # tenant of every request when auth is off

# Pseudo-replica in the prefix index for blocks held by the Mooncake store.
STORE_REPLICA = "store"

# kv_transfer_params key: true skips the KV connector's store lookup for a request
# (kvstore/connector.py), sent when the router's index says the store holds nothing more.
NO_LOOKUP = "baton_no_lookup"

# What a replica whose engine died answers (503, Retry-After ENGINE_DEAD_RETRY_S): a front that
# sent it the request runs it elsewhere (deployments/front/relay.py `engine_gone`).
ENGINE_DEAD_RETRY_S = 1
ENGINE_GONE = {"error": {"message": "the model's engine stopped; retry shortly", "type": "server_error",
                         "param": None, "code": "engine_unavailable"}}
