"""The PPO value model: a transformer backbone (the causal LM without its vocabulary head) and a
scalar value head. ``values[b, t]`` is the value of the state after token ``t`` (the state from
which token ``t+1`` is sampled), so it is next-token aligned like every training-side forward.

Saved as the backbone's Hugging Face checkpoint plus ``value_head.pt``.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from .packing import real_token_hidden, unpack, use_packing
from .prefix import prefix_tree, tree_hidden
from .vision import has_images, vision_hidden

HEAD_FILE = "value_head.pt"


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        # A zero head starts every value at 0, i.e. at the critic-free baseline.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_causal_lm(cls, lm: nn.Module) -> ValueModel:
        return cls(lm.base_model, lm.config.get_text_config().hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                autocast_dtype: torch.dtype | None = None, *, packing: bool | None = None,
                max_pack_tokens: int | None = None, prefix_sharing: bool = False, vision=None) -> torch.Tensor:
        """``[B, S]`` float32 values (0 at padding) of a right-padded ``[B, S]`` batch (``vision``: each row's
        images, for an image-text-to-text backbone; ``model/vision.py``).

        The backbone runs only the real tokens, packed (see ``model/packing.py``; ``packing`` None =
        when supported, True/False = force), or the padded batch as a fallback. With
        ``prefix_sharing`` rows' common prefixes are computed once (``model/prefix.py``).
        """
        ctx = torch.autocast(input_ids.device.type, autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx:
            if prefix_sharing:
                tree = prefix_tree(input_ids, attention_mask, max_tree_tokens=max_pack_tokens)
                values = self.value_head(tree_hidden(self.backbone, tree)).squeeze(-1).float()[tree.slot]
            else:
                hidden = (vision_hidden(self.backbone, input_ids, attention_mask, vision,
                                        packing=use_packing(self.backbone, attention_mask, packing),
                                        max_pack_tokens=max_pack_tokens) if has_images(vision) else
                          real_token_hidden(self.backbone, input_ids, attention_mask, packing=packing,
                                            max_pack_tokens=max_pack_tokens))  # [N, H]
                values = self.value_head(hidden).squeeze(-1).float()
        return unpack(values, attention_mask)

    def gradient_checkpointing_enable(self) -> None:
        b = self.backbone
        getattr(b, "activation_checkpointing_enable", b.gradient_checkpointing_enable)()

    def save_pretrained(self, path: str) -> None:
        self.backbone.save_pretrained(path)
        torch.save(self.value_head.state_dict(), os.path.join(path, HEAD_FILE))

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32) -> ValueModel:
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(path, dtype=dtype)
        model = cls(backbone, backbone.config.get_text_config().hidden_size)
        model.value_head.load_state_dict(torch.load(os.path.join(path, HEAD_FILE), weights_only=True))
        return model
