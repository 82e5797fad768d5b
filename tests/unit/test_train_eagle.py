"""The EAGLE head of the default model (cluster/default_model/train_eagle.py): causal, and committed with its inputs."""

from __future__ import annotations

from cluster.default_model import train_eagle
from common.constants import DEFAULT_MODEL_DIR


def test_the_head_is_causal():
    """A later token never changes an earlier position's output (vLLM runs the head causally)."""
    import torch  # here, not at the top: collecting the unit tests stays light
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(DEFAULT_MODEL_DIR)
    cfg.num_hidden_layers, cfg._attn_implementation = 1, "sdpa"
    head = train_eagle._head(cfg).eval()
    embeds, feats, pos = torch.randn(1, 6, cfg.hidden_size), torch.randn(1, 6, cfg.hidden_size), torch.arange(6)[None]
    later = embeds.clone()
    later[0, 5] += 1
    a, b = head(embeds, feats, pos), head(later, feats, pos)
    assert torch.allclose(a[0, :5], b[0, :5]) and not torch.allclose(a[0, 5], b[0, 5])


def test_committed_head_matches_its_inputs_and_names_what_vllm_loads():
    from safetensors import safe_open

    assert train_eagle.built() is not None  # retrain (python -m cluster.default_model.train_eagle) after changing its inputs
    with safe_open(train_eagle.EAGLE_DIR / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "fc.weight" in names and all(n == "fc.weight" or n.startswith("layers.0.") for n in names)
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)  # shared with the target
