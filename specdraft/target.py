"""TargetModel: the big model Mp, its KV cache, and the only API that touches that cache.

The decoding loop feeds it [newest token] + draft (K+1 positions) in one forward, reads the logits
at every position, and crops the cache back to the accepted prefix. Drafters that reuse the target
(early exit, Medusa) go through the same public methods, never through the cache object.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class TargetOutput:
    """One target forward."""

    logits: Tensor  # [B, n, V] float32 for the last n positions (n = num_logits or all)
    hidden: Tensor  # [B, k, H] last-layer (post-norm) hidden states of every input position


class TargetModel:
    """Wraps a Hugging Face causal LM (decoder + lm_head) and its KV cache.

    model: any `*ForCausalLM` whose `base_model` returns last hidden states and whose
        `get_output_embeddings()` is the lm_head (Llama, Mistral, Qwen2, GPT-2, ...).
    tokenizer: optional, used by the CLI/bench and by drafters that compare vocabularies.
    eos_token_ids: tokens that end generation; defaults to the model's (generation) config.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: object | None = None,
        eos_token_ids: list[int] | None = None,
    ) -> None:
        model.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.decoder: nn.Module = model.base_model
        self.lm_head: nn.Module = model.get_output_embeddings()
        self.eos_token_ids = (
            list(eos_token_ids) if eos_token_ids is not None else _default_eos(model, tokenizer)
        )
        self._cache: DynamicCache | None = None

    # ----------------------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def vocab_size(self) -> int:
        """Rows of the lm_head: the size of every distribution p."""
        return int(self.lm_head.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generated) the model supports."""
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    @property
    def cache_length(self) -> int:
        """Number of positions currently in the KV cache."""
        return 0 if self._cache is None else int(self._cache.get_seq_length())

    # ----------------------------------------------------------------------------- cache API
    def reset(self) -> None:
        """Start a new sequence: an empty KV cache."""
        self._cache = DynamicCache(config=self.config)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of the KV cache (roll back rejected draft tokens)."""
        current = self.cache_length
        if not 0 <= length <= current:
            raise ValueError(f"cannot crop a KV cache of {current} positions to {length}.")
        if length < current:
            assert self._cache is not None
            self._cache.crop(length - current)  # transformers 5: a negative count removes

    @torch.inference_mode()
    def forward(self, token_ids: Tensor, num_logits: int | None = None) -> TargetOutput:
        """Run token_ids [B, k] after the cached positions and append them to the cache.

        num_logits: compute lm_head logits only for the last `num_logits` positions (None = all,
        0 = none: a prefill that only fills the cache). The lm_head is a large share of a small
        model's cost, so the loop asks only for what the verifier reads.
        """
        if self._cache is None:
            self.reset()
        out = self.decoder(input_ids=token_ids, cache=self._cache, use_cache=True)
        hidden = out.last_hidden_state  # [B, k, H]
        n = hidden.shape[1] if num_logits is None else num_logits
        if n > 0:
            logits = self.lm_head(hidden[:, hidden.shape[1] - n :]).float()  # [B, n, V]
        else:
            logits = hidden.new_zeros((hidden.shape[0], 0, self.vocab_size))
        return TargetOutput(logits=logits, hidden=hidden)


def _default_eos(model: PreTrainedModel, tokenizer: object | None) -> list[int]:
    ids: list[int] = []
    sources = [getattr(model, "generation_config", None), model.config]
    for src in sources:
        eos = getattr(src, "eos_token_id", None)
        ids.extend([eos] if isinstance(eos, int) else list(eos or []))
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tok_eos, int):
        ids.append(tok_eos)
    return sorted(set(ids))
