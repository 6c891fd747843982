"""How a projection weight is stored and multiplied: the one place that knows the kernels.

Every model that runs on the fast stack (the target, a draft model, a quantized copy of the target)
and every drafter head builds its linears here, so a format is a setting, not a code path:

- "float" (the weights as the model holds them: exact) / "bfloat16": the weight pre-packed once by
  oneDNN (`PackedLinear`) on CPU, plain `F.linear` elsewhere. bfloat16 halves the bytes a step streams; the activations stay float32
  outside the product (the input is rounded to bfloat16 for it, the output comes back as float32).
- "int4": weight-only 4-bit, asymmetric per group of `group_size` inputs (w = scale * q + min,
  q in 0..15, the layout of GGUF's Q4_1), multiplied by torch's CPU int4 kernel
  (`_weight_int4pack_mm_for_cpu`, bfloat16 activations). A weight that already lies on such a grid
  (a model dequantized from Q4_1 at the same group size) is reproduced exactly by `quantize_int4`.
- "int8": weight-only 8-bit, symmetric per output channel, torch's `_weight_int8pack_mm`.

Which one pays is a measurement (benchmarks/weight_formats.py prints one pass of a model's linears in
every format, side by side); nothing here decides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

FORMATS = ("float", "bfloat16", "int4", "int8")
INT4_GROUP_SIZES = (32, 64, 128, 256)  # the group sizes torch's int4 kernel accepts
_PACK_ROWS = 16  # oneDNN packing hint: the row count the layout is tuned for (1..16 all measured)
_MIN_ROWS = 4  # fewer rows are zero-padded to 4: oneDNN's 1-3-row kernels stream the weights slower.
_INT4_OUT_MULTIPLE = 16  # the int4 kernel's output count must be a multiple of this (zero rows pad it)
_INT4_ROWS = 4  # the int4 kernel is fast for a few rows at a time: larger inputs go in blocks of 4


@dataclass(frozen=True)
class WeightFormat:
    """How the projections of one model are stored. kind: one of FORMATS; group_size: int4 only,
    inputs per (scale, min) pair (every projection's input size must be a multiple of it)."""

    kind: str = "float"
    group_size: int = 32

    def __post_init__(self) -> None:
        if self.kind not in FORMATS:
            raise ValueError(f"weight format must be one of {FORMATS}, got {self.kind!r}.")
        if self.kind == "int4" and self.group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"int4 group_size must be one of {INT4_GROUP_SIZES}, got {self.group_size!r}.")


FLOAT = WeightFormat()  # the model's own weights, exact


class Linear(Protocol):
    """y = x W^T + b for inputs [..., I] -> [..., O] float32, whatever the stored format."""

    out_features: int
    nbytes: int  # bytes of the stored weight (+ scales), what one product streams

    def __call__(self, x: Tensor) -> Tensor: ...


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 instructions oneDNN uses (AVX-512 BW/VL/DQ or AVX-NE-CONVERT). Elsewhere
    (AVX2) bfloat16 products are emulated and slower than float32: packing and autocast stay off there."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear:
    """A float weight frozen in the layout that is fastest for few rows on this device (oneDNN
    reorder on CPU; `F.linear` on the plain weight elsewhere). The output has the input's dtype
    when the weight has it; a bfloat16 weight takes float32 inputs and returns float32."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype | None = None) -> None:
        weight = weight.detach()  # [O, I]
        if dtype is not None:
            weight = weight.to(dtype)
        self.out_features = int(weight.shape[0])
        self.dtype = weight.dtype
        self.bias = None if bias is None else bias.detach().to(weight.dtype)
        self.nbytes = weight.numel() * weight.element_size()
        self.packed = (
            weight.device.type == "cpu"
            and torch.backends.mkldnn.is_available()
            and (weight.dtype == torch.float32
                 or (weight.dtype == torch.bfloat16 and cpu_has_bf16()))
        )
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS) if self.packed else weight
        # rows 0..n-1 of the input are copied in; rows n.. hold whatever an earlier call left (zeros at
        # first, finite values after): each output row depends on its own input row only, and those
        # rows are sliced away
        with torch.inference_mode():
            self._pad = weight.new_zeros(_MIN_ROWS, weight.shape[1]) if self.packed else None  # [4, I]

    def __call__(self, x: Tensor) -> Tensor:  # [..., I] -> [..., O]
        out_dtype = x.dtype
        if out_dtype != self.dtype:
            x = x.to(self.dtype)
        if not self.packed:
            y = F.linear(x, self.weight, self.bias)
            return y if out_dtype == self.dtype else y.to(out_dtype)
        rows = x.reshape(-1, x.shape[-1])  # [N, I]
        n = rows.shape[0]
        if n < _MIN_ROWS and self._pad is not None and torch.is_inference_mode_enabled():
            self._pad[:n].copy_(rows)  # (an inference tensor may only be written in inference mode)
            rows = self._pad  # [4, I]
        elif n < _MIN_ROWS:
            rows = torch.cat([rows, rows.new_zeros(_MIN_ROWS - n, rows.shape[1])])  # [4, I]
        y = torch.ops.mkldnn._linear_pointwise(rows, self.weight, self.bias, "none", [], "")  # [N|4, O]
        y = y[:n].view(*x.shape[:-1], self.out_features)
        return y if out_dtype == self.dtype else y.to(out_dtype)


def quantize_int4(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric 4-bit groups along the input dimension: weight [O, I] -> (q [O, I] int32 in
    0..15, scale [O, I/g], minimum [O, I/g]) with w ~ scale * q + minimum (GGUF Q4_1's rule:
    the group's min maps to 0 and its max to 15, so a weight already on such a grid comes back)."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(
            f"int4 groups of {group_size} inputs do not divide a projection with {in_features} inputs; "
            f"choose a group_size that divides {in_features}."
        )
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)  # [O, G, g]
    minimum = groups.amin(-1)  # [O, G]
    scale = (groups.amax(-1) - minimum) / 15  # [O, G]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((groups - minimum[..., None]) / safe[..., None]).round().clamp_(0, 15).to(torch.int32)
    return q.reshape(out_features, in_features), scale, minimum


def dequantize_int4(q: Tensor, scale: Tensor, minimum: Tensor) -> Tensor:
    """The float32 weight [O, I] that (q [O, I], scale [O, G], minimum [O, G]) stand for."""
    out_features, in_features = q.shape
    groups = q.reshape(out_features, scale.shape[1], -1).float()  # [O, G, g]
    return (groups * scale[..., None] + minimum[..., None]).reshape(out_features, in_features)


class Int4Linear:
    """Weight-only int4 (`quantize_int4`) through torch's CPU int4 kernel; bfloat16 activations."""

    def __init__(self, weight: Tensor, bias: Tensor | None, group_size: int) -> None:
        if weight.device.type != "cpu":
            raise ValueError("the int4 weight format runs on CPU only; on CUDA use the bitsandbytes backend.")
        self.out_features = int(weight.shape[0])
        rows = -self.out_features % _INT4_OUT_MULTIPLE  # the kernel packs outputs in blocks of 16
        weight = torch.cat([weight.detach(), weight.new_zeros(rows, weight.shape[1])]) if rows else weight
        q, scale, minimum = quantize_int4(weight, group_size)
        self.group_size = group_size
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # [O, I/2] uint8
        # the kernel's convention: w = (q - 8) * scale + zero, per (input group, output) pair
        zero = minimum + 8 * scale  # [O, G]
        self.scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().float()
        self.nbytes = self.packed.numel() + self.scales_and_zeros.numel() * 2

    def __call__(self, x: Tensor) -> Tensor:  # [..., I] -> [..., O] float32
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # [N, I]
        if rows.shape[0] <= _INT4_ROWS:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch.cat([
                torch.ops.aten._weight_int4pack_mm_for_cpu(
                    rows[i : i + _INT4_ROWS], self.packed, self.group_size, self.scales_and_zeros
                )
                for i in range(0, rows.shape[0], _INT4_ROWS)
            ])  # [N, O padded]
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        y = y.float()  # [N, O]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class Int8Linear:
    """Weight-only int8, symmetric per output channel, through torch's `_weight_int8pack_mm`."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        w = weight.detach().float()  # [O, I]
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # [O]
        self.weight = (w / scale[:, None]).round().clamp_(-127, 127).to(torch.int8)  # [O, I]
        self.scale = scale
        self.out_features = int(w.shape[0])
        self.bias = None if bias is None else bias.detach().float()
        self.nbytes = self.weight.numel() + self.scale.numel() * 4

    def __call__(self, x: Tensor) -> Tensor:  # [..., I] -> [..., O] float32
        rows = x.reshape(-1, x.shape[-1]).float()  # [N, I]
        y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)  # [N, O]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def make_linear(weight: Tensor, bias: Tensor | None, fmt: WeightFormat = FLOAT) -> Linear:
    """The linear for weight [O, I] (+ bias [O]) stored in `fmt`."""
    if fmt.kind == "int4":
        return Int4Linear(weight, bias, fmt.group_size)
    if fmt.kind == "int8":
        return Int8Linear(weight, bias)
    return PackedLinear(weight, bias, torch.bfloat16 if fmt.kind == "bfloat16" else None)
