"""Ragged rows in one KV cache: many sequences of their own lengths in one batch.

A batch's KV cache has one width S (its columns); each row marks which of its columns hold its own
tokens (`RowLayout.valid` [B, S]). Prompts of different lengths start left padded; every forward
appends k columns to every row (a row's padding in them is marked invalid); a rollback marks a
row's rejected columns invalid and crops the common width to the longest row, so nothing is copied
when rows accept different numbers of draft tokens. Each row's positions count its own valid
columns only, and every query attends to its row's valid columns (and itself), so a row decodes as
it would alone (up to float rounding in a batched product).

Rollbacks leave holes (invalid columns in the middle of a row) that every later forward still
attends over, masked. When holes make up more than `COMPACT_FRACTION` of the cache, `compaction`
returns the per-row gather that packs each row's valid columns to the right (left padding again):
one copy of the cache, paid rarely, instead of attention over dead columns in every layer of
every later forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

COMPACT_FRACTION = 0.25  # pack the rows when more than this share of the cache's cells are holes


def padding_mask(valid: Tensor, queries: int, dtype: torch.dtype) -> Tensor:
    """Additive mask [B, 1, queries, S] for the last `queries` of S columns, valid [B, S] bool:
    0 where a query may look (a valid key at or before it, and always itself, so a padding query's
    softmax is never empty), -inf elsewhere."""
    s = valid.shape[1]
    q_pos = torch.arange(s - queries, s, device=valid.device)  # [q]
    k_pos = torch.arange(s, device=valid.device)  # [S]
    allowed = (k_pos[None, :] <= q_pos[:, None])[None] & valid[:, None, :]  # [B, q, S]
    allowed |= (k_pos[None, :] == q_pos[:, None])[None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill(~allowed, float("-inf"))
    return mask[:, None]  # [B, 1, q, S]


def left_padded(valid: Tensor) -> bool:
    """Whether valid [B, S] bool marks every row's own tokens as one run that ends at the last
    column (a batch of prompts, left padded to the longest)."""
    s = valid.shape[1]
    first = s - valid.sum(dim=1)  # [B] each row's first own column
    return bool((valid == (torch.arange(s, device=valid.device)[None] >= first[:, None])).all())


@dataclass
class RowLayout:
    """Which cache columns belong to which row. valid: [B, S] bool on the cache's device."""

    valid: Tensor

    @property
    def width(self) -> int:
        """S, the cache's common number of columns."""
        return int(self.valid.shape[1])

    def row_lengths(self) -> Tensor:
        """[B] long: each row's own cached tokens."""
        return self.valid.sum(dim=1)

    def inputs(self, new_valid: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """For k new columns, new_valid [B, k] bool: (the additive attention mask [B, 1, k, S + k],
        position ids [B, k]: each new token's index among its row's own tokens)."""
        valid = torch.cat([self.valid, new_valid], dim=1)  # [B, S + k]
        positions = valid.long().cumsum(dim=1)[:, self.width:] - 1  # [B, k]
        return padding_mask(valid, new_valid.shape[1], dtype), positions.clamp(min=0)

    def append(self, new_valid: Tensor) -> None:
        """k columns were written after the S cached ones (new_valid [B, k] bool)."""
        self.valid = torch.cat([self.valid, new_valid], dim=1)

    def crop_rows(self, lengths: Tensor) -> int:
        """Keep the first lengths[i] own tokens of row i (lengths [B] long); returns the new common
        width (the last column any row still uses, + 1), which the stack crops to."""
        keep = self.valid.long().cumsum(dim=1) <= lengths.to(self.valid.device)[:, None]  # [B, S]
        self.valid = self.valid & keep  # not in place: the tensor may come from inference mode
        used = self.valid.any(dim=0).nonzero()  # [n, 1]
        width = int(used[-1, 0]) + 1 if used.numel() else 0
        self.valid = self.valid[:, :width]
        return width

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only batch rows `rows` [b] (long), in this order."""
        self.valid = self.valid.index_select(0, rows.to(self.valid.device))

    def compaction(self, force: bool = False) -> Tensor | None:
        """None while holes are at most COMPACT_FRACTION of the cells (and not `force`, which packs
        any hole: the cache would outgrow the model's context); else the gather index [B, W]
        (W = the longest row) that packs every row's own columns to the right, in order (a
        row's leading entries repeat its first column: left padding, marked invalid). The caller
        gathers every layer's K/V with it and then calls `packed`."""
        lengths = self.row_lengths()  # [B]
        batch, width = self.valid.shape
        longest = int(lengths.max()) if batch else 0
        holes = batch * width - int(lengths.sum())
        padding = batch * longest - int(lengths.sum())  # what packing leaves (left padding)
        if width == 0 or holes == padding or (not force and holes - padding <= COMPACT_FRACTION * batch * width):
            return None
        order = torch.where(self.valid, torch.arange(width, device=self.valid.device), width)  # [B, S]
        cols = order.sort(dim=1).values[:, :longest]  # [B, W] own columns first, in order
        shift = longest - lengths.to(cols.device)  # [B] padding each row gets
        idx = torch.arange(longest, device=cols.device)[None] - shift[:, None]  # [B, W]
        return cols.gather(1, idx.clamp(min=0)).clamp(max=max(width - 1, 0))

    def packed(self) -> None:
        """The cache was gathered with `compaction()`'s index: rows are left padded again."""
        lengths = self.row_lengths()
        longest = int(lengths.max())
        cols = torch.arange(longest, device=self.valid.device)[None]  # [1, W]
        self.valid = cols >= (longest - lengths)[:, None]  # [B, W]
