"""The physical limit of plain decoding: bytes a decode step must read, and how fast this machine reads.

A decode step of batch size 1 streams every weight of the model once (all projections, the norms and
the lm_head; the embedding lookup reads one row; a tied embedding is the lm_head's matrix, counted
once) plus the whole KV cache so far. Divided into the measured read bandwidth that gives the
autoregressive tok/s no implementation can beat on this machine (the roofline); a speculative
method can exceed it, since one forward then yields several tokens.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn


def _unique_parameters(model: nn.Module) -> dict[int, torch.Tensor]:
    """Every parameter tensor once, keyed by its storage (tied weights share one)."""
    return {p.untyped_storage().data_ptr(): p for p in model.parameters()}


def step_bytes(target: Any, context_len: int) -> dict[str, Any]:
    """Bytes one decode step reads at `context_len` cached positions, from the target's own modules.

    Returns weights (everything but the input embedding matrix, at each tensor's dtype), the
    embedding row, kv_cache (2 * layers * kv_heads * head_dim * context_len * element size of the
    K/V projections' dtype, which the cache is kept in), total, and the context and dtype used."""
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}.")
    model, config = target.model, target.config
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = embedding.untyped_storage().data_ptr() == head.untyped_storage().data_ptr()
    params = _unique_parameters(model)
    weights = sum(p.numel() * p.element_size() for key, p in params.items()
                  if key != embedding.untyped_storage().data_ptr() or tied)
    row = 0 if tied else embedding.shape[1] * embedding.element_size()
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_dtype = next(m.weight.dtype for n, m in model.named_modules() if n.endswith("k_proj"))
    element = torch.empty((), dtype=kv_dtype).element_size()
    kv = 2 * int(config.num_hidden_layers) * kv_heads * head_dim * int(context_len) * element
    return {"weights": weights, "embedding_row": row, "kv_cache": kv, "total": weights + row + kv,
            "context": int(context_len), "dtype": str(head.dtype).removeprefix("torch.")}


def measure_read_bandwidth(
    threads: int, nbytes: int = 1 << 30, reps: int = 5, device: torch.device | str = "cpu"
) -> float:
    """Bytes per second of a streaming read of `nbytes` on `device` (a float32 sum; the default
    size is larger than any CPU cache) with `threads` torch threads: the median of `reps` timed
    passes after one untimed."""
    if nbytes < 4 or reps < 1 or threads < 1:
        raise ValueError(f"the bandwidth measurement needs nbytes >= 4, reps >= 1 and threads >= 1; "
                         f"got nbytes={nbytes}, reps={reps}, threads={threads}.")
    device = torch.device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        data.sum()  # pages touched and the kernel warm
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            data.sum()
            sync()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return data.numel() * 4 / statistics.median(times)
