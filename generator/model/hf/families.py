"""Hugging Face settings of the families (model/family_facts.py is the table): the architectures
config.json may name, the layer types, activations and RoPE types config.py reads, Gemma 4's
defaults and what it refuses."""

from __future__ import annotations

from ..family_facts import FAMILY_ROWS, HF_ARCHITECTURES
from ..spec import RopeSpec

# config.json's class -> its family's name, and the multimodal classes whose config.json keeps the
# text tower's settings under text_config: views of the family table (model/family_facts.py).
ARCHITECTURES = {arch: row.name for arch, row in HF_ARCHITECTURES.items()}


TEXT_CONFIG_ARCHITECTURES = tuple(arch for row in FAMILY_ROWS for arch in row.hf_text_towers)


GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


# Gemma4TextConfig's global-layer RoPE when config.json names none (its sliding layers': theta 1e4).
GEMMA4_DEFAULT_ROPE = RopeSpec(theta=1000000.0, scaling="proportional", rotated_fraction=0.25)


GEMMA4_UNSUPPORTED = {
    # key: (value that is supported, why)
    "use_bidirectional_attention": (None, "bidirectional attention"),
}
