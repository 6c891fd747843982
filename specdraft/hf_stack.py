"""The plain layer stack behind `TargetModel(fast=False)`: the Hugging Face decoder's own forward
and `DynamicCache`. Works for any `*ForCausalLM` (splitting into layer ranges, for early exit, needs
a Llama-style decoder). Kept as the reference the fast stack is measured and tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel
from transformers.masking_utils import create_causal_mask

from specdraft.ragged import RowLayout


class HFStack:
    """Decoder + final norm + lm_head of a Hugging Face model, with a `DynamicCache`."""

    packs_ragged: ClassVar[bool] = False  # a ragged batch's forwards run padded, masked (the reference)

    def __init__(self, model: PreTrainedModel) -> None:
        self.config = model.config
        self.decoder: nn.Module = model.base_model
        self.lm_head: nn.Module = model.get_output_embeddings()
        self.num_layers = int(self.config.num_hidden_layers)
        self.cache: DynamicCache | None = None
        self.layout: RowLayout | None = None  # the rows' columns once they are ragged (specdraft.ragged)

    # ------------------------------------------------------------------ cache
    def reset(self, batch: int = 1) -> None:
        self.cache = DynamicCache(config=self.config)
        self.layout = None

    def start_layout(self, layout: RowLayout) -> None:
        """Track ragged rows from now on."""
        if self.cache is None:
            self.reset()
        self.layout = layout

    def end_layout(self) -> None:
        """The rows are aligned again (every column valid): plain positions from now on."""
        self.layout = None

    def gather_columns(self, index: Tensor) -> None:
        """Row i keeps columns index[i] [W] in every layer: `RowLayout.compaction`."""
        assert self.cache is not None
        for layer in self.cache.layers:
            idx = index.to(layer.keys.device)[:, None, :, None].expand(
                layer.keys.shape[0], layer.keys.shape[1], index.shape[1], layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)

    def seq_length(self, layer: int = 0) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length(layer))

    def crop(self, length: int, num_layers: int) -> None:
        """Crop each of the first `num_layers` cache layers to `length` positions."""
        assert self.cache is not None
        for layer in self.cache.layers[:num_layers]:
            extra = layer.get_seq_length() - length
            if extra > 0:
                layer.crop(-extra)  # transformers 5: a negative count removes

    def keep_positions(self, positions: Sequence[int]) -> None:
        assert self.cache is not None
        for layer in self.cache.layers:
            idx = torch.as_tensor(list(positions), dtype=torch.long, device=layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)

    def keep_rows(self, rows: Tensor) -> None:
        assert self.cache is not None
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, rows.to(layer.keys.device))
            layer.values = layer.values.index_select(0, rows.to(layer.values.device))
        if self.layout is not None:
            self.layout.keep_rows(rows)

    def layer_tensors(self) -> list[tuple[Tensor, Tensor]]:
        """(keys, values) [B, kv_heads, length, D] of every layer."""
        return [] if self.cache is None else [(layer.keys, layer.values) for layer in self.cache.layers]

    def load_cache(self, tensors: Sequence[tuple[Tensor, Tensor]]) -> None:
        """A new cache holding (keys, values) [1, kv_heads, n, D] per layer as its first positions."""
        self.reset()
        assert self.cache is not None
        for i, (keys, values) in enumerate(tensors):
            self.cache.update(keys, values, i)

    # ------------------------------------------------------------------ compute
    def embed(self, token_ids: Tensor) -> Tensor:
        return self.decoder.embed_tokens(token_ids)

    def norm(self, hidden: Tensor) -> Tensor:
        return self.decoder.norm(hidden)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)

    def forward(self, token_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, features: Sequence[int] = ()) -> tuple[Tensor, Tensor | None]:
        """The HF decoder on token_ids [B, k] after the cache: (post-norm hidden [B, k, H], the
        inputs of layers `features` side by side [B, k, len(features) * H] or None). HF's
        `output_hidden_states[j]` is the input of layer j for j < num_layers."""
        if self.cache is None:
            self.reset()
        out = self.decoder(
            input_ids=token_ids, cache=self.cache, use_cache=True,
            attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=bool(features),
        )
        taps = torch.cat([out.hidden_states[j] for j in features], dim=-1) if features else None
        return out.last_hidden_state, taps

    def run_layers(self, hidden: Tensor, start: int, end: int, first_position: int) -> Tensor:
        """Decoder layers [start, end) on hidden [B, k, H] at positions first_position.., with the
        cache (each layer appends its K/V). Mirrors the HF Llama forward."""
        if start >= end:
            return hidden
        if self.cache is None:
            self.reset()
        positions = torch.arange(hidden.shape[1], device=hidden.device)[None] + first_position  # [1, k]
        mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden, attention_mask=None, cache=self.cache,
            position_ids=positions, layer_idx=start,
        )
        rope = self.decoder.rotary_emb(hidden, position_ids=positions)
        for layer in self.decoder.layers[start:end]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rope, position_ids=positions,
                           cache=self.cache, use_cache=True)
        return hidden
