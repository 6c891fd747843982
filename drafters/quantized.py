"""A quantized copy of the target as its own drafter: int4 / int8 / bfloat16 weights on the fast stack
(CPU), or bitsandbytes int8 / nf4 / fp4 on the Hugging Face stack (the CUDA kernels).

backend="fast" (the default on CPU, `backend=auto`): the copy is the target's own fast stack built
again with its projections in another format (`specdraft.linear_formats`: bits=4 -> int4 weight-only,
asymmetric groups of `group_size` inputs like GGUF's Q4_1; bits=8 -> int8 per channel; bits=16 ->
bfloat16); embeddings, norms and rotary tables are the target's tensors. By default (`share_kv`) it
drafts on the target's own KV cache: it runs only the newest token and its drafts after the target's
committed positions and crops them away, so it never prefills a prompt and never catches up.
backend="bitsandbytes" (the default on CUDA): the decoder's nn.Linear layers are replaced by
bitsandbytes modules in a copy of the Hugging Face model that shares every other tensor.
backend="torch": torch's dynamic int8 (`quantize_dynamic`, CPU, bits=8) on the Hugging Face stack.
The Hugging Face copies (and a fast copy with share_kv=False) run through `TargetModel` with a cache of
their own (`specdraft.draft_loop.DraftCache`). Every copy drafts through the shared loop (`specdraft.draft_loop.draft_autoregressively`) and returns
q = warp(its logits).

bits=32 disables quantization: the copy is exact, so q equals p up to float rounding and every draft
token is accepted at any temperature - the sanity invariant.

Logits: share_embeddings=True takes them from the target's own lm_head (no memory; exact), False
quantizes the head like the layers; `pruned_vocab` (`specdraft.vocab.resolve_pruned_vocab`) projects
onto a subset of the target's ids only (q is zero outside it, so verification stays exact), stored
in the copy's format, to cut the head's cost. `memory` reports the bytes the copy adds.

Batches (`generate_batch`): on the target's cache every row runs its newest token and drafts after
its own committed tokens (one forward per step for all rows), and each row is cropped back to its
own length; a copy with its own cache keeps per-row prefixes (`DraftCache`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from specdraft.draft_loop import DraftCache, draft_autoregressively, feed_valid
from specdraft.linear_formats import (
    FLOAT,
    INT4_GROUP_SIZES,
    Linear,
    WeightFormat,
    make_linear,
)
from specdraft.protocol import Draft, DraftContext
from specdraft.shipped import shipped_pruned_vocab
from specdraft.target import TargetModel
from specdraft.vocab import AUTO, PrunedVocab, resolve_pruned_vocab

BITS = (4, 8, 16, 32)
QUANT_TYPES = ("nf4", "fp4")
BACKENDS = ("auto", "fast", "bitsandbytes", "torch")
GROUP_SIZES = INT4_GROUP_SIZES  # inputs per 4-bit scale: torch's int4 kernel and bitsandbytes accept the same
FAST_FORMATS = {4: "int4", 8: "int8", 16: "bfloat16", 32: "float"}  # bits -> `WeightFormat.kind`


def resolve_backend(backend: str, device: torch.device) -> str:
    """backend="auto" -> the fast stack on CPU, bitsandbytes on CUDA (its kernels are CUDA's)."""
    if backend != "auto":
        return backend
    return "fast" if device.type == "cpu" else "bitsandbytes"


def _quantized_linear(
    linear: nn.Linear, bits: int, quant_type: str, backend: str, int8_threshold: float = 6.0,
    group_size: int = 64,
) -> nn.Module:
    """A bitsandbytes / torch-dynamic replacement for `linear` (its weight is read, never modified)."""
    weight = linear.weight.detach()  # [out, in]
    if backend == "torch":
        from torch.ao.quantization import quantize_dynamic

        fresh = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        fresh.load_state_dict(linear.state_dict())
        return quantize_dynamic(nn.Sequential(fresh), {nn.Linear}, dtype=torch.qint8)[0]
    import bitsandbytes as bnb

    has_bias = linear.bias is not None
    if bits == 8:
        module = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias,
                                     has_fp16_weights=False, threshold=int8_threshold)
        module.weight = bnb.nn.Int8Params(weight.clone(), requires_grad=False, has_fp16_weights=False)
    else:
        if linear.in_features % group_size:
            raise ValueError(
                f"4-bit quantization works in groups of {group_size} inputs, but a linear layer has "
                f"{linear.in_features}; use another group_size or bits=8 for this model."
            )
        module = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                                   compute_dtype=weight.dtype, quant_type=quant_type)
        module.weight = bnb.nn.Params4bit(weight.clone(), requires_grad=False, quant_type=quant_type,
                                          blocksize=group_size)
    if has_bias:
        module.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return module.to(weight.device)  # quantizes here


def quantized_copy(
    model: nn.Module, bits: int, quant_type: str = "nf4", backend: str = "bitsandbytes",
    share_embeddings: bool = True, int8_threshold: float = 6.0, group_size: int = 64,
) -> nn.Module:
    """A copy of the Hugging Face causal LM `model` whose decoder linear layers are bitsandbytes /
    torch-dynamic modules (`backend`).

    Every tensor of the copy that is not quantized IS the target's tensor (deepcopy with a memo),
    so an unquantized copy (bits=32) costs no memory. share_embeddings=False also quantizes
    the lm_head (the embedding table is always shared: a lookup costs nothing to keep exact).
    """
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    clone = copy.deepcopy(model, memo=dict(shared))
    if bits >= 16:
        return clone.eval()
    names = [n for n, m in clone.base_model.named_modules() if isinstance(m, nn.Linear)]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = clone.base_model.get_submodule(parent_name) if parent_name else clone.base_model
        setattr(parent, attr, _quantized_linear(getattr(parent, attr), bits, quant_type, backend, int8_threshold,
                                                     group_size))
    if not share_embeddings:
        head = clone.get_output_embeddings()
        clone.set_output_embeddings(_quantized_linear(head, bits, quant_type, backend, int8_threshold, group_size))
    return clone.eval()


def _module_bytes(module: nn.Module) -> dict[int, int]:
    """{data_ptr: bytes} of every tensor a module holds (params, buffers, quantization state)."""
    tensors: dict[int, int] = {}

    def add(t: object) -> None:
        if isinstance(t, Tensor) and t.numel() > 0 and not t.is_quantized:
            tensors[t.data_ptr()] = t.numel() * t.element_size()

    for t in list(module.parameters()) + list(module.buffers()):
        add(t)
        state = getattr(t, "quant_state", None)
        if state is not None:  # bitsandbytes 4-bit: absmax (+ nested) and code
            for attr in ("absmax", "code", "offset"):
                add(getattr(state, attr, None))
        add(getattr(t, "SCB", None))  # bitsandbytes int8 row scales
    for m in module.modules():
        if isinstance(m, torch.ao.nn.quantized.dynamic.Linear):  # torch int8: packed weight (+ bias)
            weight, bias = m.weight(), m.bias()
            tensors[id(m)] = weight.numel() + (0 if bias is None else bias.numel() * bias.element_size())
    return tensors


def memory_report(target_model: nn.Module, copy_model: nn.Module) -> dict[str, int]:
    """Bytes the target holds, bytes the copy adds (tensors not shared with the target)."""
    target = _module_bytes(target_model)
    mine = _module_bytes(copy_model)
    extra = sum(n for ptr, n in mine.items() if ptr not in target)
    return {"target_bytes": sum(target.values()), "copy_bytes": extra}


class QuantizedDrafter:
    """Draft with a quantized copy of the target. `specdraft-generate drafter=quantized drafter.bits=4`

    bits: 4, 8, 16 (bfloat16; fast backend) or 32 (no quantization: an exact copy).
    backend: "auto" (fast on CPU, bitsandbytes on CUDA), "fast" (the fast stack: int4 / int8 /
        bfloat16 kernels of torch, CPU for int4 and int8), "bitsandbytes" (int8, nf4, fp4) or "torch"
        (dynamic int8, CPU, bits=8).
    group_size: 4-bit only, inputs per scale (fast: asymmetric min/scale pairs like GGUF Q4_1;
        bitsandbytes: the absmax block size).
    quant_type: bitsandbytes 4-bit only: nf4 or fp4.
    share_embeddings: take logits from the target's own lm_head (True) or quantize the head too.
    pruned_vocab: "auto" = the subset shipped for this target with another artifact
        (`specdraft.shipped.shipped_pruned_vocab`; the full vocabulary when there is none); None =
        the full vocabulary; a path to a `PrunedVocab` JSON or a `PrunedVocab`: project onto that
        subset of ids only. Its rows are stored in the copy's format.
    int8_threshold: bitsandbytes LLM.int8 outlier threshold (activations above it stay in 16 bit;
        0 = pure int8); benchmarks/RESULTS.md has the measured agreement per setting.
    share_kv: fast backend: draft on the target's own KV cache (`TargetModel.with_weights`): the
        copy attends over the target's keys/values of the committed tokens and computes only the
        newest token and its drafts, so it has no prefill and no cache to catch up; False = a cache
        of its own (the copy's K/V everywhere). Either way q is the copy's, so verification is exact.
    """

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None  # Hugging Face generation has no quantized-copy mode
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(
        self,
        bits: int = 4,
        backend: str = "auto",
        group_size: int = 32,
        quant_type: str = "nf4",
        share_embeddings: bool = True,
        pruned_vocab: str | Path | PrunedVocab | None = None,
        int8_threshold: float = 6.0,
        share_kv: bool = True,
    ) -> None:
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS} (16 = bfloat16, 32 = no quantization), got {bits!r}.")
        if quant_type not in QUANT_TYPES:
            raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {quant_type!r}.")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        if group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}.")
        if backend == "torch" and bits != 8 and bits != 32:
            raise ValueError("backend='torch' supports bits=8 only; use backend='fast' or 'bitsandbytes'.")
        if backend == "bitsandbytes" and bits == 16:
            raise ValueError("bits=16 is the fast backend's bfloat16 copy; use backend='fast' (or auto).")
        self.bits, self.backend, self.group_size, self.quant_type = bits, backend, group_size, quant_type
        self.share_embeddings = share_embeddings
        self.int8_threshold = int8_threshold
        self.share_kv = share_kv
        self._shared: TargetModel | None = None  # the copy on the target's own KV cache (share_kv)
        self.pruned_vocab_spec = pruned_vocab
        self.vocab: PrunedVocab | None = None
        self.memory: dict[str, int] = {}
        self._target: TargetModel | None = None
        self._head: Linear | None = None  # the copy's own head (pruned rows, or a quantized full head)
        self._cache: DraftCache | None = None  # the copy (through TargetModel) and its KV cache

    def weight_format(self) -> WeightFormat:
        """The fast backend's format for this drafter's bits."""
        return WeightFormat(FAST_FORMATS[self.bits], self.group_size)

    def bind(self, target: TargetModel) -> None:
        """Build the quantized copy (once per target) and report its memory."""
        spec = self.pruned_vocab_spec
        if isinstance(spec, str) and spec == AUTO:  # the subset shipped for this target, if any
            spec = shipped_pruned_vocab(target)
        vocab = resolve_pruned_vocab(spec, None, target.vocab_size)
        backend = resolve_backend(self.backend, target.device)
        if backend == "torch" and target.device.type != "cpu":
            raise ValueError("backend='torch' (dynamic int8) runs on CPU only; use backend='bitsandbytes'.")
        if backend == "fast" and self.bits in (4, 8) and target.device.type != "cpu":
            raise ValueError(f"the fast backend's int{self.bits} kernels run on CPU; on CUDA use backend=bitsandbytes.")
        self._target = target
        self.vocab = vocab.to(target.device) if vocab is not None else None
        if backend == "fast":
            self._bind_fast(target)
        else:
            self._bind_hf(target, backend)
        self.reset()

    def _bind_fast(self, target: TargetModel) -> None:
        """The target's own model on the fast stack again, projections in this drafter's format."""
        fmt = self.weight_format()
        if not target.fast:
            raise ValueError("backend='fast' needs a target the fast stack runs (target.fast); use backend=bitsandbytes.")
        own_head = self.vocab is None and not self.share_embeddings
        if self.share_kv:
            runner = target.with_weights(fmt, head=own_head)
        else:
            runner = TargetModel(target.model, eos_token_ids=target.eos_token_ids, fast=True, weights=fmt,
                                 head=own_head)
        self._head = None
        if self.vocab is not None:
            self._head = make_linear(self.vocab.head(target.lm_head.weight), None, fmt)  # [M, H]
        head_bytes = self._head.nbytes if self._head is not None else 0
        # the fast stack packs its own weights, so even bits=32 holds a second (exact) copy
        self.memory = {"target_bytes": target.weight_bytes, "copy_bytes": head_bytes + runner.weight_bytes}
        self._shared = runner if self.share_kv else None
        self._cache = None if self.share_kv else DraftCache(runner)

    def _bind_hf(self, target: TargetModel, backend: str) -> None:
        """A copy of the Hugging Face model with bitsandbytes / torch-dynamic layers (its own cache)."""
        self._shared = None
        model = quantized_copy(target.model, self.bits, self.quant_type, backend, self.share_embeddings,
                               self.int8_threshold, self.group_size)
        self.memory = memory_report(target.model, model)
        self._head = None
        if self.vocab is not None:
            self._head = make_linear(self.vocab.head(target.lm_head.weight), None, FLOAT)  # [M, H]
            self.memory["copy_bytes"] += self._head.nbytes
        # quantized layers are not float nn.Linear: "auto" runs them on the Hugging Face stack
        self._cache = DraftCache(TargetModel(model, eos_token_ids=target.eos_token_ids, fast="auto"))

    def reset(self) -> None:
        """New prompt: an empty cache."""
        if self._cache is not None:
            self._cache.reset()

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """Keep only each row's cached positions that match its committed tokens (drops rejected K/V)."""
        if self._cache is not None:
            self._cache.sync(ctx)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows go on. On the target's cache there is nothing of the copy's own (the
        target drops its rows); a cache of its own drops the others' rows."""
        if self._cache is not None:
            self._cache.keep_rows(rows)

    def _next_logits(self, feed: Tensor, counts: Sequence[int] | None = None) -> Tensor:
        """Run feed [B, n] after the cached positions (row i: its last counts[i] columns, None =
        all); logits [B, M or V] of each row's next token."""
        assert self._target is not None
        if self._shared is not None:
            runner = self._shared
            valid = None if counts is None else feed_valid(feed.shape[1], counts)
            hidden = runner.forward(feed, num_logits=0, valid=valid).hidden[:, -1]  # [B, H] post-norm
        else:
            assert self._cache is not None
            runner = self._cache.runner
            hidden = self._cache.forward(feed, counts)  # [B, H] post-norm
        if self._head is not None:  # pruned rows [M, H]
            return self._head(hidden).float()
        if runner.has_head:
            return runner.logits(hidden)  # the copy's own (quantized) lm_head
        return self._target.logits(hidden)  # the target's own head

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """Catch the copy's cache up with ctx, then draft num_tokens tokens one at a time."""
        if self._cache is None and self._shared is None:
            raise ValueError("QuantizedDrafter.propose called before bind(target).")
        if self._shared is None:
            assert self._cache is not None
            # [1, n >= 1] (a batch: every row's, `RowFeed`) not yet in the copy's cache
            feed = self._cache.feed(ctx.token_ids if ctx.batch_size == 1 else ctx)
            return draft_autoregressively(self._next_logits, feed, num_tokens, ctx, self.vocab)
        return self._propose_shared_rows(ctx, num_tokens)

    def _propose_shared_rows(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """share_kv, for one row or B: the target's cache holds every committed token but the newest
        (the decoding loop's invariant); each row's newest token and drafts run after its own
        committed tokens there (ragged rows: per-row positions and masks), then every row is
        cropped back to its committed tokens before the newest."""
        shared = self._shared
        assert shared is not None and self._target is not None
        committed = [n - 1 for n in ctx.row_lengths()]
        batch = ctx.batch_size
        held = shared.row_lengths() if shared.cache_length else [0] * batch  # empty: takes B rows on its first forward
        if held != committed:
            raise ValueError(
                f"share_kv drafting expects the target's cache to hold each row's committed tokens before "
                f"its newest, {committed}, but it holds {held}; use share_kv=false here."
            )
        try:
            return draft_autoregressively(self._next_logits, ctx.token_ids[:, -1:], num_tokens, ctx, self.vocab)
        finally:
            shared.crop(committed)
