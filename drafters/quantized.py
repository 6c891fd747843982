"""A quantized copy of the target as its own drafter (INT8 / INT4 via bitsandbytes).

At `bind` the drafter builds a copy of the target whose decoder linear layers are quantized
(bitsandbytes `Linear8bitLt` for bits=8, `Linear4bit` nf4/fp4 for bits=4; or torch's dynamic int8
with backend="torch"); everything else (embeddings, norms, rotary tables, and by default the
lm_head) is the target's own tensors, not duplicated. The copy runs through `TargetModel` (the
Hugging Face stack for quantized layers, the fast stack for an unquantized copy) with its own KV
cache (`specdraft.draft_loop.DraftCache`), drafts through the shared loop
(`specdraft.draft_loop.draft_autoregressively`) and returns q = warp(its logits).

bits=16 or 32 disables quantization: the copy is exact (it shares every tensor with the target), so
q equals p up to float rounding and every draft token is accepted at any temperature - the sanity
invariant. On CPU the bitsandbytes kernels are several times slower than float32: the drafter is
correct there, but it pays only on a GPU.

Optional `pruned_vocab` (`specdraft.vocab.resolve_pruned_vocab`): project onto a subset of the
target's ids only (q is zero outside it, so verification stays exact) to cut the lm_head cost.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn

from specdraft.draft_loop import DraftCache, draft_autoregressively
from specdraft.protocol import Draft, DraftContext
from specdraft.target import TargetModel
from specdraft.vocab import PrunedVocab, resolve_pruned_vocab

BITS = (4, 8, 16, 32)
QUANT_TYPES = ("nf4", "fp4")
BACKENDS = ("bitsandbytes", "torch")
BNB_BLOCKSIZES = (32, 64, 128, 256)  # bitsandbytes 4-bit block sizes offered (64 is its default)


def _quantized_linear(
    linear: nn.Linear, bits: int, quant_type: str, backend: str, int8_threshold: float = 6.0,
    blocksize: int = 64,
) -> nn.Module:
    """A quantized replacement for `linear` (its weight is read, never modified)."""
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
        if linear.in_features % blocksize:
            raise ValueError(
                f"4-bit quantization works in blocks of {blocksize} inputs, but a linear layer has "
                f"{linear.in_features}; use another blocksize or bits=8 for this model."
            )
        module = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                                   compute_dtype=weight.dtype, quant_type=quant_type)
        module.weight = bnb.nn.Params4bit(weight.clone(), requires_grad=False, quant_type=quant_type,
                                          blocksize=blocksize)
    if has_bias:
        module.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return module.to(weight.device)  # quantizes here


def quantized_copy(
    model: nn.Module, bits: int, quant_type: str = "nf4", backend: str = "bitsandbytes",
    share_embeddings: bool = True, int8_threshold: float = 6.0, blocksize: int = 64,
) -> nn.Module:
    """A copy of the causal LM `model` whose decoder linear layers are quantized to `bits`.

    Every tensor of the copy that is not quantized IS the target's tensor (deepcopy with a memo),
    so an unquantized copy (bits >= 16) costs no memory. share_embeddings=False also quantizes
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
                                                     blocksize))
    if not share_embeddings:
        head = clone.get_output_embeddings()
        clone.set_output_embeddings(_quantized_linear(head, bits, quant_type, backend, int8_threshold, blocksize))
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

    bits: 8 (int8), 4 (quant_type nf4 or fp4), or 16/32 = no quantization (an exact copy).
    backend: "bitsandbytes" (CPU path here, CUDA kernels on a GPU) or "torch" (dynamic int8, bits=8).
    share_embeddings: keep the target's lm_head (True) or quantize it too (False).
    pruned_vocab: None = the full vocabulary; a path to a `PrunedVocab` JSON or a `PrunedVocab`:
        project onto that subset of ids only ("auto" is None too: a quantized copy has no artifact
        to save a subset with).
    int8_threshold: LLM.int8 outlier threshold (activations above it stay in 16 bit; 0 = pure int8).
        Lower thresholds agree more often with the target but keep more columns in 16 bit (slower);
        benchmarks/RESULTS.md has the measured agreement per setting.
    blocksize: inputs per 4-bit quantization block (one absmax scale each; smaller = more exact,
        more scale memory); bitsandbytes' default is 64.
    """

    needs_target_hidden: ClassVar[bool] = False
    hf_counterpart: ClassVar[str | None] = None  # Hugging Face generation has no quantized-copy mode
    verify_curve_tokens: ClassVar[int] = 0

    def __init__(
        self,
        bits: int = 8,
        quant_type: str = "nf4",
        backend: str = "bitsandbytes",
        share_embeddings: bool = True,
        pruned_vocab: str | Path | PrunedVocab | None = None,
        int8_threshold: float = 6.0,
        blocksize: int = 64,
    ) -> None:
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS} (16/32 = no quantization), got {bits!r}.")
        if quant_type not in QUANT_TYPES:
            raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {quant_type!r}.")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        if blocksize not in BNB_BLOCKSIZES:
            raise ValueError(f"blocksize must be one of {BNB_BLOCKSIZES}, got {blocksize!r}.")
        if backend == "torch" and bits == 4:
            raise ValueError("backend='torch' supports bits=8 only; use backend='bitsandbytes' for 4 bits.")
        self.bits, self.quant_type, self.backend = bits, quant_type, backend
        self.share_embeddings = share_embeddings
        self.int8_threshold = int8_threshold
        self.blocksize = blocksize
        self.pruned_vocab_spec = pruned_vocab
        self.vocab: PrunedVocab | None = None
        self.model: nn.Module | None = None
        self.memory: dict[str, int] = {}
        self._head: Tensor | None = None  # [M, H] pruned head rows
        self._cache: DraftCache | None = None  # the copy (through TargetModel) and its KV cache

    def bind(self, target: TargetModel) -> None:
        """Build the quantized copy (once per target) and report its memory."""
        vocab = resolve_pruned_vocab(self.pruned_vocab_spec, None, target.vocab_size)
        if self.backend == "torch" and target.device.type != "cpu":
            raise ValueError("backend='torch' (dynamic int8) runs on CPU only; use backend='bitsandbytes'.")
        self.model = quantized_copy(target.model, self.bits, self.quant_type, self.backend,
                                    self.share_embeddings, self.int8_threshold, self.blocksize)
        self.memory = memory_report(target.model, self.model)
        self.vocab = vocab.to(target.device) if vocab is not None else None
        self._head = self.vocab.head(target.lm_head.weight) if self.vocab is not None else None
        # quantized layers are not float nn.Linear: "auto" runs them on the Hugging Face stack
        self._cache = DraftCache(TargetModel(self.model, eos_token_ids=target.eos_token_ids, fast="auto"))
        self.reset()

    def reset(self) -> None:
        """New prompt: an empty cache."""
        if self._cache is not None:
            self._cache.reset()

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        """Keep only the cached positions that match the committed tokens (drops rejected K/V)."""
        if self._cache is not None:
            self._cache.sync(ctx.token_ids)

    def _next_logits(self, feed: Tensor) -> Tensor:
        """Run feed [1, n] after the cached positions; logits [1, M or V] of the next token."""
        assert self._cache is not None
        hidden = self._cache.forward(feed)  # [1, H] post-norm
        if self.vocab is not None:
            return self.vocab.logits(hidden, self._head).float()
        return self._cache.runner.logits(hidden)  # the copy's own lm_head (quantized or shared)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """Catch the copy's cache up with ctx, then draft num_tokens tokens one at a time."""
        if self._cache is None:
            raise ValueError("QuantizedDrafter.propose called before bind(target).")
        if ctx.token_ids.shape[0] != 1:
            raise NotImplementedError("QuantizedDrafter supports batch size 1.")
        feed = self._cache.feed(ctx.token_ids)  # [1, n >= 1] not yet in the copy's cache
        return draft_autoregressively(self._next_logits, feed, num_tokens, ctx, self.vocab)
