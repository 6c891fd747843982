"""TargetModel: the big model Mp, its KV cache, and the only API that touches that cache.

The decoding loop feeds it [newest token] + draft (K+1 positions) in one forward, reads the logits
at every position, and crops the cache back to the accepted prefix. Drafters that reuse the target
(early exit, Medusa) go through the same public methods, never through the cache object; drafters
that run a model of their own (a draft model, a quantized copy) wrap it in a TargetModel too
(`specdraft.draft_loop.DraftCache`), so every model runs on the same two stacks.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from specdraft.cuda_graphs import VerifyGraphs
from specdraft.fast_stack import FastStack, fast_path_unsupported
from specdraft.hf_stack import HFStack
from specdraft.linear_formats import FLOAT, WeightFormat
from specdraft.ragged import RowLayout, left_padded


@dataclass(frozen=True)
class TargetOutput:
    """One target forward."""

    logits: Tensor  # [B, n, V] float32 for the last n positions (n = num_logits or all)
    hidden: Tensor  # [B, k, H] last-layer (post-norm) hidden states of every input position
    # [B, k, F] the inputs of the layers `forward(features=...)` asked for, side by side
    # (F = len(features) * H; layer j's input = HF's output_hidden_states[j]); None when none was asked
    features: Tensor | None = None


@dataclass
class _PrefixState:
    """Positions run through the first `num_layers` layers only (early-exit drafting), after the
    `base` positions that every layer has cached. Their K/V are in the cache for layers <
    num_layers; `hidden` is their output of layer num_layers, reused by the next `forward`."""

    num_layers: int
    base: int
    token_ids: Tensor  # [B, P]
    hidden: Tensor  # [B, P, H] pre-norm output of layer num_layers


def check_feature_layers(layers: Sequence[int], num_layers: int) -> None:
    """A clear error for feature layer ids outside [0, num_layers) or repeated."""
    bad = [j for j in layers if not 0 <= int(j) < num_layers]
    if bad or len(set(layers)) != len(layers):
        raise ValueError(
            f"feature layers must be distinct layer ids in [0, {num_layers}) (the input of layer j; 0 = the "
            f"embeddings), got {list(layers)}."
        )


class TargetModel:
    """Wraps a Hugging Face causal LM (decoder + lm_head) and its KV cache.

    model: any `*ForCausalLM` whose `base_model` returns last hidden states and whose
        `get_output_embeddings()` is the lm_head (Llama, Mistral, Qwen2, GPT-2, ...).
    tokenizer: optional, used by the CLI/bench and by drafters that compare vocabularies.
    eos_token_ids: tokens that end generation; defaults to the model's (generation) config.
    fast: run the target through `FastStack` (packed weights, preallocated in-place KV cache;
        specdraft/fast_stack.py) instead of the plain Hugging Face forward (`HFStack`). "auto" =
        fast when the architecture supports it (`fast_path_unsupported`: e.g. quantized layers,
        which are not float nn.Linear, run on the plain path). The plain path stays for comparison
        (`target.fast=false`). `model` itself is never modified: drafters may read its weights.
    cuda_graphs: replay the verify forward (k <= 17 new positions) as CUDA graphs
        (specdraft/cuda_graphs.py); "auto" = when fast and the model is on CUDA.
    weights: how the fast stack stores the projections (`specdraft.linear_formats.WeightFormat`):
        FLOAT (the model's own weights) for a target; int4 / bfloat16 / int8 for a quantized copy
        of it that drafts (drafters/quantized.py). head=False builds no lm_head (such a copy may
        take its logits from the target's head or a pruned one).
    """

    GRAPH_POSITIONS = 17  # verify forwards of up to 16 draft tokens + the newest token are graphed
    GRAPH_CONTEXT = 4096  # KV positions preallocated when graphs are on (the buffer must not move)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: object | None = None,
        eos_token_ids: list[int] | None = None,
        fast: bool | str = "auto",
        cuda_graphs: bool | str = "auto",
        weights: WeightFormat = FLOAT,
        head: bool = True,
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
        self.fast = _resolve_fast(model, fast)
        if (weights != FLOAT or not head) and not self.fast:
            raise ValueError(
                f"weights={weights.kind!r} / head={head} need the fast stack, which cannot run this model "
                f"({fast_path_unsupported(model) or 'fast=false was asked for'}); use the model's own weights."
            )
        self._stack: FastStack | HFStack = FastStack(model, weights, head) if self.fast else HFStack(model)
        self._graphs: VerifyGraphs | None = None
        if _resolve_graphs(self, cuda_graphs):
            assert isinstance(self._stack, FastStack)
            capacity = min(self.max_context, self.GRAPH_CONTEXT + self.GRAPH_POSITIONS)
            self._graphs = VerifyGraphs(self._stack, self.GRAPH_POSITIONS, capacity)
        self._prefix: _PrefixState | None = None  # see forward_prefix (early exit)
        # batch-size bucket -> T_v(k)/T_v(0) measured for this model instance, k = 0..; filled
        # lazily by specdraft.costs.verify_curve (the one verify-cost model), never at construction.
        self.verify_costs: dict[int, list[float]] = {}

    # ----------------------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def cuda_graphs(self) -> bool:
        """Whether verify forwards are replayed as CUDA graphs."""
        return self._graphs is not None

    @property
    def vocab_size(self) -> int:
        """Rows of the lm_head: the size of every distribution p."""
        return int(self.lm_head.weight.shape[0])

    @property
    def has_head(self) -> bool:
        """Whether `logits` works (a quantized copy may be built without its own lm_head)."""
        return not isinstance(self._stack, FastStack) or self._stack.lm_head is not None

    @property
    def weight_bytes(self) -> int:
        """Bytes of the projections and the lm_head as this model runs them: what one decode step
        streams besides an embedding row and the KV cache (`specdraft.roofline`)."""
        if isinstance(self._stack, FastStack):
            return self._stack.weight_bytes
        linears = [m for m in self.model.modules() if isinstance(m, nn.Linear)]
        tensors = {p.data_ptr(): p.numel() * p.element_size() for m in linears for p in m.parameters()}
        return sum(tensors.values())

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
        """Number of positions (columns) currently in the KV cache (of every layer: positions that
        only the first layers have seen through `forward_prefix` are not counted). With ragged rows
        this is the common width; `row_lengths` counts each row's own tokens."""
        if self._prefix is not None:
            return self._prefix.base
        return self._stack.seq_length(0)

    @property
    def ragged(self) -> bool:
        """Whether the cache tracks rows of their own lengths (`forward(..., valid=)`,
        `specdraft.ragged`): then positions and masks are per row."""
        return self._stack.layout is not None

    @property
    def packs_ragged(self) -> bool:
        """Whether a ragged batch's forward runs the projections on its real tokens only (the fast
        stack), so a row that brings fewer tokens costs less; else padding costs as much as a token."""
        return self._stack.packs_ragged

    @property
    def batch_size(self) -> int:
        """Rows in the KV cache (1 when it is empty)."""
        layers = self._stack.layer_tensors()
        return int(layers[0][0].shape[0]) if layers else 1

    def row_lengths(self) -> list[int]:
        """Each row's own cached tokens (all equal to `cache_length` unless ragged)."""
        layout = self._stack.layout
        if layout is None:
            return [self.cache_length] * self.batch_size
        return [int(n) for n in layout.row_lengths().tolist()]

    # ----------------------------------------------------------------------------- cache API
    def reset(self) -> None:
        """Start a new sequence: an empty KV cache."""
        self._stack.reset()
        self._prefix = None
        if self._graphs is not None:
            self._stack.kv.reserve(self._graphs.capacity)  # type: ignore[union-attr]

    def crop(self, length: int | Sequence[int] | Tensor) -> None:
        """Roll back rejected draft tokens: keep the first `length` positions of the KV cache, or
        per row (a sequence of B lengths) the first length[i] of row i's own tokens. Ragged rows
        are marked, not moved (no copy); when holes fill too much of the cache the rows are packed
        once (`specdraft.ragged.RowLayout.compaction`)."""
        if isinstance(length, int) and not self.ragged:
            current = self.cache_length
            if not 0 <= length <= current:
                raise ValueError(f"cannot crop a KV cache of {current} positions to {length}.")
            self._prefix = None  # pending early-exit positions (if any) are beyond `length` too
            self._stack.crop(length, self.num_layers)
            return
        current = self.row_lengths()
        lengths = [length] * len(current) if isinstance(length, int) else [int(n) for n in length]
        if len(lengths) != len(current) or any(not 0 <= n <= c for n, c in zip(lengths, current)):
            raise ValueError(f"cannot crop rows holding {current} tokens to {lengths}.")
        if not self.ragged:
            if len(set(lengths)) == 1:  # the rows stay aligned: a plain crop
                self.crop(lengths[0])
                return
            self._start_layout()
        self.discard_prefix()
        layout = self._stack.layout
        assert layout is not None
        self._stack.crop(layout.crop_rows(torch.as_tensor(lengths, dtype=torch.long)), self.num_layers)
        self._compact()

    @torch.inference_mode()  # the fast stack's buffers may be inference tensors: copy in that mode
    def keep_positions(self, positions: Sequence[int]) -> None:
        """Keep only the given KV-cache positions, in this order (tree verification: the committed
        prefix + the accepted path, whose K/V are copied into place)."""
        current = self.cache_length
        if self.ragged:
            raise ValueError("keep_positions (tree verification) needs batch size 1, not ragged rows.")
        if self._prefix is not None or any(not 0 <= p < current for p in positions):
            raise ValueError(f"cache positions must be in [0, {current}), got {list(positions)}.")
        self._stack.keep_positions(positions)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows of the KV cache, in this order (finished sequences leave the
        batch, so the next forwards cost nothing for them)."""
        self.discard_prefix()
        self._stack.keep_rows(torch.as_tensor(list(rows), dtype=torch.long))
        layout = self._stack.layout
        if layout is not None:  # the columns only the dropped rows used go, and maybe the holes
            self._stack.crop(layout.crop_rows(layout.row_lengths()), self.num_layers)
            self._compact(force=len(rows) == 1)  # one row left: packed, it is a plain batch of one again

    def _start_layout(self) -> None:
        """Start tracking ragged rows: every cached column so far belongs to every row."""
        valid = torch.ones((self.batch_size, self.cache_length), dtype=torch.bool, device=self.device)
        self._stack.start_layout(RowLayout(valid))

    @torch.inference_mode()
    def _compact(self, force: bool = False) -> None:
        """Pack the ragged rows when holes fill too much of the cache, or any hole when `force`
        (one copy)."""
        layout = self._stack.layout
        index = None if layout is None else layout.compaction(force)
        if index is not None:
            assert layout is not None
            self._stack.gather_columns(index)
            layout.packed()
        if layout is not None and bool(layout.valid.all()):  # the rows are aligned again: no layout needed
            self._stack.end_layout()

    def with_weights(self, weights: WeightFormat, head: bool = False) -> TargetModel:
        """This target's model with its projections stored in `weights`, reading and writing THIS
        target's KV cache (fast stack only): a quantized copy that drafts on the target's own cache,
        with no prefill and no cache of its own. Its forwards append after the target's cached
        positions; the caller crops them away before the target's next forward (a crop of either
        is a crop of both). q stays whatever the copy computes, so verification stays exact."""
        if not isinstance(self._stack, FastStack):
            raise ValueError("with_weights needs the fast stack (target.fast); this target runs the plain one.")
        copy = TargetModel(self.model, self.tokenizer, self.eos_token_ids, fast=True, cuda_graphs=False,
                           weights=weights, head=head)
        assert isinstance(copy._stack, FastStack)
        copy._stack.share_cache(self._stack)
        return copy

    def cache_tensors(self) -> list[tuple[Tensor, Tensor]]:
        """(keys, values) [B, kv_heads, length, D] of every layer's cache (read-only views: tests
        compare them with a fresh forward, the prefix cache copies them)."""
        return self._stack.layer_tensors()

    @torch.inference_mode()  # the fast stack's buffers may be inference tensors: write in that mode
    def load_cache(self, tensors: Sequence[tuple[Tensor, Tensor]]) -> None:
        """Start a new sequence whose first n positions are already computed: (keys, values)
        [1, kv_heads, n, D] of every layer, copied from an earlier `cache_tensors` of the same
        tokens (`specdraft.prefix_cache`). Batch size 1."""
        if len(tensors) != self.num_layers or any(k.shape[0] != 1 or k.shape != v.shape for k, v in tensors):
            raise ValueError(f"load_cache needs (keys, values) [1, kv_heads, n, head_dim] for each of the "
                             f"{self.num_layers} layers, got {len(tensors)} layers.")
        if len({k.shape[2] for k, _ in tensors}) != 1:
            raise ValueError("load_cache needs the same number of positions in every layer.")
        self.reset()
        self._stack.load_cache(tensors)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: Tensor,
        num_logits: int | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        valid: Tensor | None = None,
        features: Sequence[int] = (),
    ) -> TargetOutput:
        """Run token_ids [B, k] after the cached positions and append them to the cache.

        num_logits: compute lm_head logits only for the last `num_logits` positions (None = all,
        0 = none: a prefill that only fills the cache). The lm_head is a large share of a small
        model's cost, so the loop asks only for what the verifier reads.
        attention_mask / position_ids: optional 4D additive mask [B, 1, k, cached + k] and positions
        [B, k] (tree verification, specdraft/tree.py); None = the usual causal continuation.
        valid: [B, k] bool, which inputs are real tokens of their row (False = padding: a prompt
        shorter than the batch's longest, a row's draft shorter than the longest draft). Given once,
        the cache tracks each row's own tokens from then on (`ragged`): every row gets its own
        positions and attends to its own tokens only, as if it ran alone.
        features: layer ids j in [0, num_layers) whose inputs (the residual stream after layer j - 1;
        0 = the embeddings) come back as `TargetOutput.features`, from this same forward (what
        feature-level drafters such as EAGLE-3 read). Not with an early-exit prefix pending.
        """
        if features:
            check_feature_layers(features, self.num_layers)
        if valid is not None and not self.ragged:
            if self.cache_length == 0:
                self._stack.start_layout(RowLayout(valid.new_zeros((valid.shape[0], 0))))
            else:
                self._start_layout()
        layout = self._stack.layout
        if layout is not None:
            if attention_mask is not None or position_ids is not None:
                raise ValueError("a ragged batch builds its own masks and positions; trees run at batch size 1.")
            self.discard_prefix()
            if layout.width + token_ids.shape[1] > self.max_context:  # holes would outgrow the context
                self._compact(force=True)
            new_valid = (torch.ones(token_ids.shape, dtype=torch.bool) if valid is None else valid).to(self.device)
            packs = self._stack.packs_ragged and not features
            if packs and layout.width == 0 and token_ids.shape[1] > 1 and left_padded(new_valid):
                hidden, taps = self._stack.prefill_packed(token_ids, new_valid), None  # a batch's prefill
            else:
                mask, positions = layout.inputs(new_valid, self._stack.embed(token_ids[:, :1]).dtype)
                if packs and layout.width > 0 and not bool(new_valid.all()):  # rows that drafted less
                    hidden, taps = self._stack.forward_packed(token_ids, new_valid, mask, positions), None
                else:
                    hidden, taps = self._stack.forward(token_ids, mask, positions, features)
            layout.append(new_valid)
        elif attention_mask is not None or position_ids is not None:
            self.discard_prefix()
            hidden, taps = self._stack.forward(token_ids, attention_mask, position_ids, features)
        elif self._prefix is not None:
            if features:
                raise ValueError("layer features cannot be read while an early-exit prefix is pending; "
                                 "call discard_prefix() first.")
            hidden, taps = self._forward_after_prefix(token_ids), None  # [B, k, H]
        elif self._graphs is not None and self._graphs.usable(token_ids) and not features:
            hidden, taps = self._graphs.run(token_ids), None
        else:
            hidden, taps = self._stack.forward(token_ids, features=features)
        out = self._output(hidden, num_logits)
        return out if taps is None else dataclasses.replace(out, features=taps)

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """float32 logits [..., V] of post-norm hidden states [..., H] through the lm_head, on the
        same (packed, when fast) path as `forward`. Inference only (no autograd)."""
        return self._stack.logits(hidden).float()

    def _output(self, hidden: Tensor, num_logits: int | None) -> TargetOutput:
        """Logits of the last `num_logits` positions of post-norm hidden [B, k, H]."""
        n = hidden.shape[1] if num_logits is None else num_logits
        if n > 0:
            logits = self.logits(hidden[:, hidden.shape[1] - n :])  # [B, n, V] float32
        else:
            logits = hidden.new_zeros((hidden.shape[0], 0, self.vocab_size))
        return TargetOutput(logits=logits, hidden=hidden)

    # ------------------------------------------------------------------ shared prefix (early exit)
    @property
    def supports_layer_split(self) -> bool:
        """Whether the decoder exposes the Llama-style parts `forward_prefix` runs one by one."""
        return all(hasattr(self.decoder, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))

    @torch.inference_mode()
    def forward_prefix(self, token_ids: Tensor, num_layers: int) -> Tensor:
        """Run token_ids [B, k] through the first `num_layers` decoder layers only and return their
        output of layer `num_layers` [B, k, H] (pre final norm): early-exit drafting.

        The K/V of those layers go into the target's own cache (shared KV), after the positions
        already there; the hidden states are remembered, so the next `forward` whose inputs start
        with the same tokens runs only layers >= num_layers for them (plus every layer for the rest).
        `crop`, `reset` and `discard_prefix` forget them.
        """
        if not self.supports_layer_split:
            raise ValueError(
                f"{type(self.decoder).__name__} does not expose embed_tokens/layers/norm/rotary_emb, "
                "so it cannot be split for early exit; use a Llama-style target."
            )
        if self.ragged:
            raise ValueError("forward_prefix (early exit) runs at batch size 1, not on ragged rows.")
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(f"num_layers must be in [1, {self.num_layers}], got {num_layers}.")
        st = self._prefix
        if st is not None and st.num_layers != num_layers:
            raise ValueError(
                f"forward_prefix was called with num_layers={num_layers} while {st.token_ids.shape[1]} "
                f"positions are pending at num_layers={st.num_layers}; crop or forward first."
            )
        base = self.cache_length
        done = 0 if st is None else st.token_ids.shape[1]
        embeds = self._stack.embed(token_ids)  # [B, k, H]
        hidden = self._stack.run_layers(embeds, 0, num_layers, base + done)  # [B, k, H]
        if st is None:
            self._prefix = _PrefixState(num_layers, base, token_ids, hidden)
        else:
            st.token_ids = torch.cat([st.token_ids, token_ids], dim=1)
            st.hidden = torch.cat([st.hidden, hidden], dim=1)
        return hidden

    def discard_prefix(self) -> None:
        """Forget the positions `forward_prefix` added (the next forward recomputes every layer)."""
        if self._prefix is not None:
            base, self._prefix = self._prefix.base, None
            self._stack.crop(base, self.num_layers)

    def _forward_after_prefix(self, token_ids: Tensor) -> Tensor:
        """forward() while positions are pending: reuse their layers < E when the inputs start with
        them, else recompute everything. Returns post-norm hidden [B, k, H]."""
        st = self._prefix
        assert st is not None
        num_pending = st.token_ids.shape[1]
        if num_pending > token_ids.shape[1] or not torch.equal(token_ids[:, :num_pending], st.token_ids):
            self.discard_prefix()
            return self._stack.forward(token_ids)[0]
        self._prefix = None
        hidden = st.hidden  # [B, P, H] layers < E already done (and cached) for the pending tokens
        rest = token_ids[:, num_pending:]  # [B, k-P]
        if rest.shape[1] > 0:
            tail = self._stack.run_layers(self._stack.embed(rest), 0, st.num_layers, st.base + num_pending)
            hidden = torch.cat([hidden, tail], dim=1)  # [B, k, H]
        hidden = self._stack.run_layers(hidden, st.num_layers, self.num_layers, st.base)
        return self._stack.norm(hidden)


def _resolve_graphs(target: TargetModel, cuda_graphs: bool | str) -> bool:
    """cuda_graphs="auto" -> fast stack on CUDA; True -> both required (clear error otherwise)."""
    on_cuda = target.fast and target.device.type == "cuda"
    if cuda_graphs == "auto":  # dynamic RoPE variants read the max position on the host: not capturable
        rope = getattr(getattr(target.decoder, "rotary_emb", None), "rope_type", "default")
        return on_cuda and rope in ("default", "linear", "llama3")
    if not isinstance(cuda_graphs, bool):
        raise ValueError(f"cuda_graphs must be true, false or 'auto', got {cuda_graphs!r}.")
    if cuda_graphs and not on_cuda:
        raise ValueError("cuda_graphs=true needs the fast stack on a CUDA device; use cuda_graphs=auto.")
    return cuda_graphs


def _resolve_fast(model: PreTrainedModel, fast: bool | str) -> bool:
    """fast="auto" -> whether the fast stack supports the model; True -> it must (clear error)."""
    if fast == "auto":
        return fast_path_unsupported(model) is None
    if not isinstance(fast, bool):
        raise ValueError(f"fast must be true, false or 'auto', got {fast!r}.")
    if fast and (reason := fast_path_unsupported(model)) is not None:
        raise ValueError(f"target.fast=true cannot run this model: {reason}; use target.fast=auto or false.")
    return fast


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
