"""The fast layer stack behind `TargetModel(fast=True)`: the same Llama-family math as the Hugging
Face forward, arranged so that scoring k positions costs little more than scoring one.

What makes it fast (each kept because benchmarks/verify_cost.py showed it pays on this CPU):
- every projection is a oneDNN linear on a weight pre-packed once at load (`mkldnn` reorder): plain
  `F.linear` (MKL sgemm) takes a slow path for 2..16 rows, so T_p(5) was ~1.8x T_p(1);
- q/k/v and gate/up are fused into one matrix each (fewer, larger products);
- the KV cache is preallocated and written in place (no `torch.cat` per layer per forward), and a
  rollback only moves a length: nothing is copied;
- grouped-query attention goes to `scaled_dot_product_attention(enable_gqa=True)`, instead of
  materialising repeated K/V heads; a verify forward (a few positions after a long cache: a chain,
  or a tree whose mask every row shares) stacks the query heads of each K/V head as rows of one
  attention (`_grouped_attention`), since the CPU kernel's cost there is in multiplying few rows
  at a time;
- a prefill (empty cache) uses SDPA's causal mode, which skips the masked half of the blocks; a
  batch of prompts of different lengths is prefilled packed (`prefill_packed`): the projections
  run on the rows' own tokens only, never on the padding, and each row attends causally over its
  own tokens; later forwards of a ragged batch whose rows bring different numbers of tokens (rows
  that drafted less) are packed the same way (`forward_packed`): only attention sees the padding;
- a continuation's mask is built once per forward as an additive float mask (`continuation_mask`),
  so nothing per layer or per round scales with the context except the attention itself.
On CUDA (or when oneDNN is missing) the projections fall back to `F.linear` on the fused weights.
The Hugging Face model is left untouched (drafters and peers still use it); the packed copies cost
one extra copy of the weights in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdraft.linear_formats import FLOAT, Linear, WeightFormat, make_linear
from specdraft.ragged import RowLayout

FAST_MODEL_TYPES = ("llama", "mistral", "qwen2")


def fast_path_unsupported(model: nn.Module) -> str | None:
    """Why `model` cannot use the fast stack (None when it can)."""
    config = model.config
    if config.model_type not in FAST_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {FAST_MODEL_TYPES}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention is not implemented in the fast stack"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    linears = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1].endswith("_proj")]
    odd = [type(m).__name__ for m in linears if type(m) is not nn.Linear or not m.weight.is_floating_point()]
    if odd:
        return f"its projections are {odd[0]} modules (quantized?), not float nn.Linear"
    return None


def continuation_mask(past: int, k: int, dtype: torch.dtype, device: torch.device, groups: int = 1) -> Tensor:
    """Additive mask [groups * k, past + k] for k new positions after `past` cached ones: 0 where
    query i may look (every cached position and block positions <= i), -inf elsewhere; row
    r is query r % k (the layout of `FastStack._grouped_attention`, which stacks the `groups` query
    heads of one K/V head). Built once per forward in the dtype SDPA adds (a boolean or a
    repeated mask would be converted or copied again in every layer)."""
    query = torch.arange(groups * k, device=device) % k  # [g*k]
    cols = torch.arange(past + k, device=device)  # [past + k]
    allowed = cols[None] <= (past + query)[:, None]  # [g*k, past + k]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Hugging Face's LlamaRMSNorm, op for op (so the values match): the variance in float32,
    x * rsqrt(variance + eps), times the weight in the input's dtype. x [..., H], weight [H].
    (`F.rms_norm` runs the same math as several more dispatched ops on CPU.)"""
    if x.dtype != torch.float32:
        wide = x.float()
        return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """The rotary tables of k positions, cos/sin [B|1, k, D], prepared once per forward for
    `apply_rope`: (cos [B|1, k, 1, D], sin with its first half negated [B|1, k, 1, D])."""
    half = sin.shape[-1] // 2
    signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return cos[:, :, None], signed[:, :, None]


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotary embedding of x [B, k, heads, D] (Hugging Face's rotate-half convention): x * cos +
    rotate_half(x) * sin, with rotate_half(x) * sin = roll(x, D/2) * signed_sin (the same products:
    only the sign moved from x to sin, which IEEE multiplication does not see)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def _fused(modules: Sequence[nn.Linear], fmt: WeightFormat) -> Linear:
    """One linear in format `fmt` computing all `modules` side by side (outputs concatenated)."""
    weight = torch.cat([m.weight.detach() for m in modules], dim=0)  # [sum O, I]
    biases = [m.bias for m in modules]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(modules, biases)]
    )
    return make_linear(weight, bias, fmt)


@dataclass(frozen=True)
class _Layer:
    norm1: Tensor  # [H] input_layernorm weight
    qkv: Linear  # H -> (heads + 2 kv_heads) * head_dim
    out: Linear  # heads * head_dim -> H
    norm2: Tensor  # [H] post_attention_layernorm weight
    gate_up: Linear  # H -> 2 * intermediate
    down: Linear  # intermediate -> H


class KVBuffer:
    """Preallocated keys/values [B, kv_heads, capacity, head_dim] per layer, written in place.

    Each layer has its own length (early exit leaves the first layers longer). Appending past the
    capacity doubles it (one copy); past `max_length` it raises instead of corrupting anything.
    `layout` says which columns belong to which row once a batch's rows have different lengths
    (`specdraft.ragged`); it lives here so a stack sharing this cache shares it too."""

    def __init__(self, num_layers: int, shape: tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device, max_length: int, capacity: int = 256) -> None:
        self.batch, self.kv_heads, self.head_dim = shape
        self.dtype, self.device, self.max_length = dtype, device, max_length
        self.capacity = min(capacity, max_length)
        self.keys = [self._empty(self.capacity) for _ in range(num_layers)]
        self.values = [self._empty(self.capacity) for _ in range(num_layers)]
        self.lengths = [0] * num_layers
        self.layout: RowLayout | None = None
        self.version = 0  # bumped whenever the buffers move (captured CUDA graphs become stale)

    def _empty(self, capacity: int) -> Tensor:
        # zeros, not empty: the static (CUDA-graph) attention reads masked slots too, and 0 * NaN = NaN
        return torch.zeros(self.batch, self.kv_heads, capacity, self.head_dim, dtype=self.dtype, device=self.device)

    def append(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write keys/values [B, kv_heads, n, D] after the layer's cached positions; return views of
        everything cached for that layer [B, kv_heads, length + n, D]."""
        start = self.lengths[layer]
        end = start + keys.shape[2]
        if end > self.capacity:
            self._grow(end)
        self.keys[layer][:, :, start:end] = keys
        self.values[layer][:, :, start:end] = values
        self.lengths[layer] = end
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def reserve(self, capacity: int) -> None:
        """Make the buffers hold `capacity` positions now (CUDA graphs need buffers that never move)."""
        if capacity > self.capacity:
            self._grow(capacity)

    def _grow(self, needed: int) -> None:
        if needed > self.max_length:
            raise ValueError(
                f"the sequence needs {needed} positions but the target supports at most {self.max_length} "
                "(max_position_embeddings); shorten the prompt or max_new_tokens."
            )
        capacity = min(max(needed, 2 * self.capacity), self.max_length)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = self._empty(capacity)
                new[:, :, : self.lengths[i]] = old[:, :, : self.lengths[i]]
                store[i] = new
        self.capacity = capacity
        self.version += 1

    def crop(self, length: int, num_layers: int) -> None:
        """Forget positions >= length in the first num_layers layers (no copy)."""
        for i in range(num_layers):
            self.lengths[i] = min(self.lengths[i], length)

    def keep_positions(self, positions: Sequence[int]) -> None:
        """Keep only `positions` (in this order) in every layer: tree verification's accepted path."""
        keep = list(positions)
        start = 0  # positions already in place (the committed prefix) are not copied
        while start < len(keep) and keep[start] == start:
            start += 1
        idx = torch.as_tensor(keep[start:], dtype=torch.long, device=self.device)
        for i in range(len(self.lengths)):
            if len(idx):
                for store in (self.keys, self.values):
                    store[i][:, :, start : len(keep)] = store[i].index_select(2, idx)
            self.lengths[i] = len(keep)

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only batch rows `rows` [b] (long), in this order: sequences that finished leave."""
        rows = rows.to(self.device)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = old.index_select(0, rows)
        self.batch = int(rows.numel())
        if self.layout is not None:
            self.layout.keep_rows(rows)
        self.version += 1

    def gather_columns(self, index: Tensor) -> None:
        """Row i keeps columns index[i] [W] (in this order) in every layer: `RowLayout.compaction`."""
        width = index.shape[1]
        idx = index.to(self.device)[:, None, :, None].expand(self.batch, self.kv_heads, width, self.head_dim)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                old[:, :, :width] = old.gather(2, idx)  # gather copies first, so overlap is safe
        self.lengths = [width] * len(self.lengths)

    def tensors(self) -> list[tuple[Tensor, Tensor]]:
        """(keys, values) [B, kv_heads, length, D] of every layer (views)."""
        return [(k[:, :, :n], v[:, :, :n]) for k, v, n in zip(self.keys, self.values, self.lengths)]


def unpack_heads(packed: Tensor, valid: Tensor) -> Tensor:
    """Per-head states of N packed tokens [1, h, N, D] back into their rows' places [B, h, W, D]
    (valid [B, W] bool, N = valid.sum()), zeros at the padding."""
    out = packed.new_zeros((*valid.shape, packed.shape[1], packed.shape[3]))  # [B, W, h, D]
    out[valid] = packed[0].transpose(0, 1)
    return out.transpose(1, 2)


class FastStack:
    """The decoder layers, final norm and lm_head of a Llama-family model with packed weights and
    a `KVBuffer`; same interface as `HFStack` (see specdraft/target.py)."""

    packs_ragged: ClassVar[bool] = True  # `prefill_packed` / `forward_packed`: a ragged batch's projections skip the padding

    def __init__(self, model: nn.Module, weights: WeightFormat = FLOAT, head: bool = True) -> None:
        """weights: how the decoder's projections are stored (`specdraft.linear_formats`; FLOAT = the
        model's own, exact); head: build the lm_head (in the same format) or not (a drafter that
        computes its logits elsewhere, e.g. from the target's own head or a pruned one)."""
        reason = fast_path_unsupported(model)
        if reason is not None:
            raise ValueError(f"the fast target path cannot run this model: {reason}; use target.fast=false.")
        config = model.config
        decoder = model.base_model
        self.config = config
        self.embed_tokens: nn.Module = decoder.embed_tokens
        self.rotary_emb: nn.Module = decoder.rotary_emb
        self.eps = float(config.rms_norm_eps)
        self.num_heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.group = self.num_heads // self.kv_heads  # query heads per K/V head
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.scaling = self.head_dim**-0.5
        self.layers = [
            _Layer(
                norm1=layer.input_layernorm.weight.detach(),
                qkv=_fused([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], weights),
                out=_fused([layer.self_attn.o_proj], weights),
                norm2=layer.post_attention_layernorm.weight.detach(),
                gate_up=_fused([layer.mlp.gate_proj, layer.mlp.up_proj], weights),
                down=_fused([layer.mlp.down_proj], weights),
            )
            for layer in decoder.layers
        ]
        self.final_norm = decoder.norm.weight.detach()
        self.weights = weights
        self.lm_head: Linear | None = _fused([model.get_output_embeddings()], weights) if head else None
        self.num_layers = len(self.layers)
        self._kv: KVBuffer | None = None
        self._cache_owner: FastStack | None = None  # see share_cache

    # ------------------------------------------------------------------ cache
    @property
    def kv(self) -> KVBuffer | None:
        """The KV buffer this stack reads and writes: its own, or its cache owner's (`share_cache`)."""
        return self._cache_owner.kv if self._cache_owner is not None else self._kv

    @kv.setter
    def kv(self, buffer: KVBuffer | None) -> None:
        if self._cache_owner is not None:
            raise ValueError("this stack uses another stack's KV cache (share_cache); reset that one.")
        self._kv = buffer

    def share_cache(self, owner: FastStack) -> None:
        """Read and write `owner`'s KV buffer from now on (a quantized copy drafting on the target's
        own cache). The models must have the same layer, head and head sizes; `reset` then leaves
        the buffer alone (it is the owner's), `crop` crops it for both."""
        mine = (self.num_layers, self.kv_heads, self.head_dim)
        theirs = (owner.num_layers, owner.kv_heads, owner.head_dim)
        if mine != theirs:
            raise ValueError(f"cannot share a KV cache between stacks of (layers, kv_heads, head_dim) {mine} and {theirs}.")
        self._cache_owner = owner

    def reset(self, batch: int = 1) -> None:
        """Empty cache; the buffers are kept (no allocation per generation, graphs stay valid).
        A stack sharing another's cache leaves it to its owner."""
        if self._cache_owner is not None:
            return
        if self.kv is not None and self.kv.batch == batch:
            self.kv.lengths = [0] * self.num_layers
            self.kv.layout = None
            return
        self.kv = KVBuffer(
            self.num_layers, (batch, self.kv_heads, self.head_dim), self.final_norm.dtype,
            self.final_norm.device, int(getattr(self.config, "max_position_embeddings", 1 << 20)),
        )

    def seq_length(self, layer: int = 0) -> int:
        return 0 if self.kv is None else self.kv.lengths[layer]

    @property
    def layout(self) -> RowLayout | None:
        """The rows' columns once they are ragged (`specdraft.ragged`), else None."""
        return None if self.kv is None else self.kv.layout

    def start_layout(self, layout: RowLayout) -> None:
        """Track ragged rows from now on (a new batch of layout.valid.shape[0] rows on an empty
        cache gets a buffer of that batch size first)."""
        batch = int(layout.valid.shape[0])
        if self.kv is None or self.kv.batch != batch:
            if self.seq_length(0):
                raise ValueError(f"the cache holds {self.kv.batch if self.kv else 0} rows, not {batch}.")
            self.reset(batch)
        assert self.kv is not None
        self.kv.layout = layout

    def end_layout(self) -> None:
        """The rows are aligned again (every column valid): plain positions from now on."""
        if self.kv is not None:
            self.kv.layout = None

    def gather_columns(self, index: Tensor) -> None:
        assert self.kv is not None
        self.kv.gather_columns(index)

    def crop(self, length: int, num_layers: int) -> None:
        assert self.kv is not None
        self.kv.crop(length, num_layers)

    def keep_positions(self, positions: Sequence[int]) -> None:
        assert self.kv is not None
        self.kv.keep_positions(positions)

    def keep_rows(self, rows: Tensor) -> None:
        if self._cache_owner is not None:
            raise ValueError("a stack that shares another's KV cache cannot drop its rows; its owner does.")
        assert self.kv is not None
        self.kv.keep_rows(rows)

    def layer_tensors(self) -> list[tuple[Tensor, Tensor]]:
        return [] if self.kv is None else self.kv.tensors()

    def load_cache(self, tensors: Sequence[tuple[Tensor, Tensor]]) -> None:
        """An emptied cache holding (keys, values) [1, kv_heads, n, D] per layer as its first
        positions (written into the preallocated buffers)."""
        self.reset(1)
        assert self.kv is not None
        for i, (keys, values) in enumerate(tensors):
            self.kv.append(i, keys, values)

    # ------------------------------------------------------------------ compute
    def embed(self, token_ids: Tensor) -> Tensor:  # [B, k] -> [B, k, H]
        return self.embed_tokens(token_ids)

    def norm(self, hidden: Tensor) -> Tensor:
        return rms_norm(hidden, self.final_norm, self.eps)

    def logits(self, hidden: Tensor) -> Tensor:  # [B, n, H] -> [B, n, V]
        if self.lm_head is None:
            raise ValueError("this stack was built without an lm_head (head=False); compute logits elsewhere.")
        return self.lm_head(hidden)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every projection (and the lm_head, if built) as stored: what a decode step streams
        besides one embedding row and the KV cache."""
        linears = [lin for layer in self.layers for lin in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        return sum(lin.nbytes for lin in linears + ([self.lm_head] if self.lm_head is not None else []))

    def forward(self, token_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, features: Sequence[int] = ()) -> tuple[Tensor, Tensor | None]:
        """All layers on token_ids [B, k] after the cache: (post-norm hidden [B, k, H], the inputs
        of layers `features` side by side [B, k, len(features) * H], or None when none is asked;
        `specdraft.target.TargetOutput.features`)."""
        self._take_batch(token_ids.shape[0])
        hidden = self.embed(token_ids)
        taps: list[Tensor] = []
        hidden = self.run_layers(hidden, 0, self.num_layers, self.seq_length(0), attention_mask, position_ids,
                                 features, taps)
        return self.norm(hidden), (torch.cat(taps, dim=-1) if taps else None)

    def _take_batch(self, batch: int) -> None:
        """Make the cache hold `batch` rows (an empty shared cache takes them from its owner)."""
        if self.kv is None or self.kv.batch != batch:
            if self._cache_owner is not None and self.seq_length(0) == 0:
                self._cache_owner.reset(batch)
            else:
                self.reset(batch)

    def prefill_packed(self, token_ids: Tensor, valid: Tensor) -> Tensor:
        """A batch's first forward (empty cache) on token_ids [B, W] whose own tokens, valid [B, W]
        bool, are left padded (`specdraft.ragged.left_padded`). The rows' N own tokens are packed
        into one sequence [1, N]: every projection runs on them only (none on the padding), and each
        row attends causally over its own tokens alone, at its own positions 0..n_i - 1, as it would
        in a prefill of its own. K/V go to each row's own columns and zeros to its padding columns
        (which the row layout masks). Returns post-norm hidden [B, W, H], zeros at the padding."""
        batch, width = token_ids.shape
        self._take_batch(batch)
        assert self.kv is not None
        kv = self.kv
        lengths = valid.sum(dim=1).tolist()  # [B] own tokens per row
        positions = (valid.long().cumsum(dim=1) - 1)[valid]  # [N] each token's index in its row
        hidden = self.embed(token_ids[valid][None])  # [1, N, H]
        rope = rope_tables(*self.rotary_emb(hidden, position_ids=positions[None]))  # [1, N, 1, D] each

        def attend(i: int, q: Tensor, key: Tensor, val: Tensor) -> Tensor:
            kv.append(i, unpack_heads(key, valid), unpack_heads(val, valid))
            rows = zip(q.split(lengths, dim=2), key.split(lengths, dim=2), val.split(lengths, dim=2))
            return torch.cat([self._attention(qr, kr, vr, None, causal=True)  # [1, nh, n_i, D] each
                              for qr, kr, vr in rows if qr.shape[2] > 0], dim=2)  # [1, nh, N, D]

        for i in range(self.num_layers):
            hidden = self._layer(i, hidden, rope, attend)
        out = hidden.new_zeros((batch, width, hidden.shape[-1]))  # [B, W, H]
        out[valid] = self.norm(hidden)[0]
        return out

    def forward_packed(self, token_ids: Tensor, valid: Tensor, mask: Tensor, position_ids: Tensor) -> Tensor:
        """A ragged batch's forward on token_ids [B, k] after the cache, of which valid [B, k] bool
        are real tokens (rows that drafted fewer than the longest draft are padded): the projections
        and the MLP run on the N real tokens packed into [1, N], attention runs per row over the
        cache as `forward` does (mask [B, 1, k, S + k] and position_ids [B, k] from
        `specdraft.ragged.RowLayout.inputs`). K/V of padding columns are zeros (masked by the row
        layout). Returns post-norm hidden [B, k, H], zeros at the padding."""
        batch, k = token_ids.shape
        self._take_batch(batch)
        assert self.kv is not None
        kv = self.kv
        hidden = self.embed(token_ids[valid][None])  # [1, N, H]
        rope = rope_tables(*self.rotary_emb(hidden, position_ids=position_ids[valid][None]))  # [1, N, 1, D] each

        def attend(i: int, q: Tensor, key: Tensor, val: Tensor) -> Tensor:
            keys, values = kv.append(i, unpack_heads(key, valid), unpack_heads(val, valid))  # [B, kvh, S+k, D]
            out = self._attention(unpack_heads(q, valid), keys, values, mask)  # [B, nh, k, D]
            return out.transpose(1, 2)[valid].transpose(0, 1)[None]  # [1, nh, N, D]

        for i in range(self.num_layers):
            hidden = self._layer(i, hidden, rope, attend)
        out = hidden.new_zeros((batch, k, hidden.shape[-1]))  # [B, k, H]
        out[valid] = self.norm(hidden)[0]
        return out

    def run_layers(self, hidden: Tensor, start: int, end: int, first_position: int,
                   attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                   tap_layers: Sequence[int] = (), taps: list[Tensor] | None = None) -> Tensor:
        """Layers [start, end) on hidden [B, k, H]; each appends its K/V. attention_mask: additive
        [B, 1, k, past + k] (trees) or None for the causal continuation; position_ids [B, k].
        tap_layers: append the input of each of these layers ([B, k, H], in the listed order) to
        `taps` (layers outside [start, end) are not tapped)."""
        if start >= end:
            return hidden
        if self.kv is None:
            self.reset(hidden.shape[0])
        assert self.kv is not None
        k = hidden.shape[1]
        past = self.kv.lengths[start]
        if position_ids is None:
            position_ids = torch.arange(first_position, first_position + k, device=hidden.device)[None]  # [1, k]
        mask = attention_mask
        causal = mask is None and k > 1 and past == 0  # a prefill: SDPA's is_causal skips masked blocks
        shared = mask is not None and mask.shape[0] == 1 and mask.shape[1] == 1  # one mask for every row and head
        grouped = (mask is None or shared) and k > 1 and past > 0 and self.group > 1
        if mask is None and k > 1 and past > 0:  # query i sees every cached position and block positions <= i
            groups = self.group if grouped else 1
            mask = continuation_mask(past, k, hidden.dtype, hidden.device, groups)  # [g*k, past + k], all layers
        elif grouped:  # a tree's mask [1, 1, k, past + k], once per group member, like `continuation_mask`
            mask = mask.reshape(k, -1).repeat(self.group, 1)  # [g*k, past + k]
        rope = rope_tables(*self.rotary_emb(hidden, position_ids=position_ids))  # once for every layer
        kv = self.kv

        def attend(i: int, q: Tensor, key: Tensor, val: Tensor) -> Tensor:
            keys, values = kv.append(i, key, val)  # [B, kvh, past + k, D]
            if grouped:
                return self._grouped_attention(q, keys, values, mask)
            return self._attention(q, keys, values, mask, causal)

        inputs: dict[int, Tensor] = {}
        for i in range(start, end):
            if i in tap_layers:
                inputs[i] = hidden
            hidden = self._layer(i, hidden, rope, attend)
        if taps is not None:
            taps.extend(inputs[i] for i in tap_layers if i in inputs)
        return hidden

    def _attention(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None,
                   causal: bool = False) -> Tensor:
        """q [B, nh, k, D] over keys/values [B, kvh, S, D] (grouped heads, no repeat) -> [B, nh, k, D].
        causal: q and keys are the same k positions (S == k), causally masked."""
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=causal, scale=self.scaling, enable_gqa=self.group > 1
        )

    def _grouped_attention(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        """A few new positions after the cache (verification): the `group` query heads that share
        a K/V head become rows of one attention over it, so the kernel multiplies group * k rows
        at a time instead of k and reads each cached K/V once per K/V head. The same values as
        `_attention` (each row's softmax is its own). mask: [group * k, S] from `continuation_mask`."""
        batch, _, k, dim = q.shape
        rows = q.reshape(batch, self.kv_heads, self.group * k, dim)  # [B, kvh, g*k, D]: heads are kv-major
        out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, scale=self.scaling)
        return out.view(batch, self.num_heads, k, dim)  # [B, nh, k, D]

    def _layer(self, i: int, hidden: Tensor, rope: tuple[Tensor, Tensor],
               attend: Callable[[int, Tensor, Tensor, Tensor], Tensor]) -> Tensor:
        """Decoder layer i on hidden [B, k, H]; rope: `rope_tables` of the k positions;
        `attend(i, q, key, val)` stores the new K/V and returns the attention output [B, nh, k, D]."""
        layer = self.layers[i]
        batch, k, _ = hidden.shape
        nh, kvh, dim = self.num_heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(rms_norm(hidden, layer.norm1, self.eps)).view(batch, k, nh + 2 * kvh, dim)
        qk = apply_rope(qkv[:, :, : nh + kvh], *rope)  # [B, k, nh + kvh, D]: q and k rotated in one go
        q = qk[:, :, :nh].transpose(1, 2)  # [B, nh, k, D]
        key = qk[:, :, nh:].transpose(1, 2)  # [B, kvh, k, D]
        val = qkv[:, :, nh + kvh :].transpose(1, 2)  # [B, kvh, k, D]
        attn = attend(i, q, key, val)  # [B, nh, k, D]
        hidden = hidden + layer.out(attn.transpose(1, 2).reshape(batch, k, nh * dim))
        gate, up = layer.gate_up(rms_norm(hidden, layer.norm2, self.eps)).chunk(2, dim=-1)  # [B, k, I] each
        return hidden + layer.down(F.silu(gate) * up)

    def run_static(self, token_ids: Tensor, base: Tensor) -> Tensor:
        """All layers on token_ids [B, k] at positions base..base+k-1 (base: a [1] long tensor on
        the device), attending over the whole preallocated buffer with a mask: no shape and no host
        value depends on the cache length, so this is what a CUDA graph captures
        (specdraft/cuda_graphs.py). Writes K/V in place; the caller advances the lengths.
        Returns post-norm hidden [B, k, H]."""
        assert self.kv is not None
        k = token_ids.shape[1]
        positions = base + torch.arange(k, device=token_ids.device)  # [k]
        hidden = self.embed(token_ids)  # [B, k, H]
        rope = rope_tables(*self.rotary_emb(hidden, position_ids=positions[None]))  # [1, k, 1, D] each
        cols = torch.arange(self.kv.capacity, device=token_ids.device)  # [S]
        mask = cols[None] <= positions[:, None]  # [k, S]: cached positions and the block causally
        kv = self.kv

        def attend(i: int, q: Tensor, key: Tensor, val: Tensor) -> Tensor:
            kv.keys[i].index_copy_(2, positions, key)
            kv.values[i].index_copy_(2, positions, val)
            return self._attention(q, kv.keys[i], kv.values[i], mask)

        for i in range(self.num_layers):
            hidden = self._layer(i, hidden, rope, attend)
        return self.norm(hidden)
