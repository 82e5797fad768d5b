"""The default model: its training and evaluation (tiny_model: the random tiny Llama and its
tokenizer; train_copy: the copying model and its draft; train_eagle: its EAGLE head; copy_eval:
the echo-rate measure), and here `ensure_default`.

The default model's three checkpoints, trained where one is missing or stale: the copying
model and its draft (cluster/default_model/train_copy.py), then its EAGLE head
(cluster/default_model/train_eagle.py), which reads the main model's features."""

from __future__ import annotations

from pathlib import Path

from common.constants import DEFAULT_MODEL_DIR, DRAFT_MODEL_DIR


def ensure_default(log=print) -> Path:
    """The default model's directory, trained (main, draft, EAGLE head) where a checkpoint is missing
    or records other inputs than these (a changed corpus or seed); a no-op on the committed ones."""
    # Here, not at the top: `python -m cluster.default_model.train_copy` imports this package first.
    from cluster.default_model import train_copy, train_eagle

    for out, role in ((DEFAULT_MODEL_DIR, "main"), (DRAFT_MODEL_DIR, "draft")):
        if train_copy.built(out, role) is None:
            log(f"training the default {role} model into {out} (a few CPU minutes, once)")
            train_copy.build(out, role, log=log)
    if train_eagle.built() is None:  # after the main model: its head reads the main model's features
        log(f"training the default model's EAGLE head into {train_eagle.EAGLE_DIR} (a few CPU minutes, once)")
        train_eagle.build(log=log)
    return DEFAULT_MODEL_DIR
