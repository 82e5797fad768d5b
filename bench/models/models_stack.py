"""The catalogue stack both parts of `baton bench models` (bench/models/models.py, bench/models/models_wake.py)
run: its models (MODELS, hottest first), its config, and the few HTTP calls the bench makes to it."""

from __future__ import annotations

import random
import sys
from contextlib import redirect_stdout
from pathlib import Path

import httpx
import yaml

from bench.models.models_plot import metric_totals
from bench.common.stack import write_config
from common.constants import DEADLINE_HEADER, REPO_ROOT

EXTRA = [{"id": f"baton-{size}-{n}", "generate": {"size": size, "seed": 20 + 10 * n + i}, "kv_cache_gb": 0.25}
         for n in (2, 3) for i, size in enumerate(("small", "medium", "wide", "deep"))]
FIRST = "baton-tiny"  # the stack's `model:`, always in the catalogue


def catalogue_entries() -> list[dict]:
    """`models:` entries of every model after FIRST, hottest first: cluster/catalogue.yaml's, then EXTRA."""
    return yaml.safe_load((REPO_ROOT / "cluster" / "catalogue.yaml").read_text())["models"] + EXTRA


MODELS = [FIRST] + [m["id"] for m in catalogue_entries()]


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def chat_body(rng: random.Random, words: int, max_tokens: int, vocab: list[str]) -> dict:
    text = " ".join(rng.choice(vocab) for _ in range(words))
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def generated(ids: list[str]) -> list[dict]:
    """The `models:` entries of `ids` (all but FIRST), generated if they are not yet (progress on stderr)."""
    from cluster.default_model import tiny_model
    from common.config.models import CatalogueModel

    entries = [e for e in catalogue_entries() if e["id"] in ids]
    with redirect_stdout(sys.stderr):
        tiny_model.generate_catalogue([CatalogueModel(**e) for e in entries])
    return entries


def stack_config(workdir: Path, ids: list[str], memory_gb: float | None, min_resident_s: float) -> Path:
    """A colocated one-replica stack serving `ids` (FIRST first); memory_gb None: all resident."""
    catalogue = {"min_resident_s": min_resident_s, **({"memory_gb": memory_gb} if memory_gb else {})}
    return write_config(workdir, colocated=True, decode={"replicas": 1, "kv_cache_gb": 0.25}, models=generated(ids),
                        catalogue=catalogue, tracing={"exporter": "none"})


def scrape(url: str) -> dict:
    return metric_totals(httpx.get(f"{url}/metrics", timeout=30).text)


def resident(url: str) -> list[str]:
    # A one-model stack (the baseline) has no catalogue: its model is always resident.
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return [m["id"] for m in models if m.get("baton", {}).get("resident", True)]


def answer_once(url: str, model: str, deadline_s: float = 120) -> None:
    """One short chat request for `model`, waiting out swaps; raises if it is not answered."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={DEADLINE_HEADER: str(deadline_s)},
                   timeout=deadline_s + 60)
    r.raise_for_status()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
