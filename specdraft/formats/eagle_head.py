"""The EAGLE-3 head artifact: one decoder layer that drafts from the target's own layer features.

At position j the head reads the embedding of token x_{j+1} (the target's embedding, shared) and
a feature of position j: for positions the target has verified, a fusion (`fc`, one linear) of
the target's hidden states entering a low, a middle and a high layer (`aux_layers`); for the
positions it drafts itself, its own pre-norm output at the position before. Its output goes
through a norm and a draft-vocabulary lm_head and guesses x_{j+2}:

    e = input_layernorm(embed(x_{j+1}))       g = fc([f_low ; f_mid ; f_high]_j)   (or own output)
    r = g (norm_before_residual: hidden_norm(g)),  a = attn(q,k,v of [e ; hidden_norm(g)]) + r
    out = mlp(post_attention_layernorm(a)) + a     logits = lm_head(norm(out))  [.., M] draft ids
    target id of draft id i = i + d2t[i]

The head has its own small KV cache (`HeadCache`) and uses the target's rotary embedding, so its
positions are the target's (pair j at position j, as vLLM's EAGLE proposer places them).

On disk it is the directory vLLM and SGLang load as an EAGLE-3 speculator (the `speculators`
format, read by vLLM's `vllm/transformers_utils/configs/speculators/{base,algos}.py` and
`vllm/model_executor/models/llama_eagle3.py`): `config.json` with `speculators_model_type:
"eagle3"`, `transformer_layer_config` (a Llama layer config), `draft_vocab_size`,
`target_hidden_size`, `norm_before_residual`, `eagle_aux_hidden_state_layer_ids` (vLLM's
convention: id j is the hidden state entering layer j, 0 the embeddings: the same ids as
`TargetModel.forward(features=...)` and HF's `output_hidden_states[j]`) and `speculators_config`
(`algorithm`, `proposal_methods[0].speculative_tokens`, `verifier.name_or_path`); and
`model.safetensors` with `fc.weight`, `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}
.weight`, `midlayer.self_attn.{q,k,v,o}_proj.weight`, `midlayer.mlp.{gate,up,down}_proj.weight`,
`norm.weight`, `lm_head.weight`, `d2t` (int64 offsets) and `t2d` (bool, which target ids the draft
vocabulary has). No embedding is stored: vLLM then shares the target's. Our own record of the
target (`specdraft.formats.target_info`) rides along in config.json under "target_model".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdraft.fast_stack import apply_rope, continuation_mask, rms_norm, rope_tables
from specdraft.formats.target_info import RECORD_KEY, check_target, read_record, target_info
from specdraft.linear_formats import PackedLinear
from specdraft.shipped import require_artifact
from specdraft.vocab import PrunedVocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel

DEFAULT_ARTIFACT = "eagle"  # a target alias names its shipped head <alias>/eagle
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HEAD_KEYS = ("hidden_size", "vocab_size", "num_layers", "tokenizer_hash")  # reads layers by id, shares ids


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's default EAGLE-3 feature layers for a target of `num_layers` layers: (2, L // 2, L - 3)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if not 0 <= layers[0] < layers[1] < layers[2] < num_layers:
        raise ValueError(f"a target of {num_layers} layers has no default EAGLE-3 feature layers (2, L/2, L-3); "
                         "pass aux_layers explicitly (three distinct ids in [0, num_layers)).")
    return layers


@dataclass(frozen=True)
class EagleConfig:
    """The head's shape and the target it reads. Layer sizes are the target's (one of its layers
    with a doubled attention input); draft_vocab_size M <= vocab_size V."""

    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...]
    max_position_embeddings: int
    norm_before_residual: bool = False

    @classmethod
    def for_target(cls, target: TargetModel, draft_vocab_size: int | None = None,
                   aux_layers: Sequence[int] | None = None) -> EagleConfig:
        c = target.config
        heads = int(c.num_attention_heads)
        layers = tuple(aux_layers) if aux_layers is not None else default_aux_layers(target.num_layers)
        return cls(
            hidden_size=target.hidden_size, target_hidden_size=target.hidden_size, num_heads=heads,
            num_kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(c, "head_dim", None) or target.hidden_size // heads),
            intermediate_size=int(c.intermediate_size), rms_norm_eps=float(c.rms_norm_eps),
            vocab_size=target.vocab_size, draft_vocab_size=int(draft_vocab_size or target.vocab_size),
            aux_layers=layers, max_position_embeddings=int(c.max_position_embeddings),
        )


@dataclass
class HeadCache:
    """The head's keys/values [B, kv_heads, L, D]; `crop` keeps the first n positions."""

    keys: Tensor
    values: Tensor

    @property
    def length(self) -> int:
        return int(self.keys.shape[2])

    def crop(self, n: int) -> None:
        self.keys, self.values = self.keys[:, :, :n], self.values[:, :, :n]


class EagleHead(nn.Module):
    """The trainable head (module docstring). Its token embedding and rotary embedding are the
    target's, passed in (`embed`, `rotary`), never stored."""

    def __init__(self, config: EagleConfig, d2t: Tensor | None = None) -> None:
        super().__init__()
        c = config
        if c.draft_vocab_size > c.vocab_size:
            raise ValueError(f"draft_vocab_size {c.draft_vocab_size} exceeds the target's vocabulary {c.vocab_size}.")
        self.config = c
        h, q_out, kv_out = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.fc = nn.Linear(len(c.aux_layers) * c.target_hidden_size, h, bias=False)
        self.q_proj = nn.Linear(2 * h, q_out, bias=False)
        self.k_proj = nn.Linear(2 * h, kv_out, bias=False)
        self.v_proj = nn.Linear(2 * h, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, h, bias=False)
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.norm = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        offsets = torch.zeros(c.draft_vocab_size, dtype=torch.long) if d2t is None else d2t.long()
        if offsets.shape != (c.draft_vocab_size,):
            raise ValueError(f"d2t must have {c.draft_vocab_size} entries, got {tuple(offsets.shape)}.")
        self.register_buffer("d2t", offsets)

    def vocab(self) -> PrunedVocab:
        """The draft vocabulary as target ids (draft id i -> i + d2t[i])."""
        return PrunedVocab(torch.arange(self.config.draft_vocab_size) + self.d2t.cpu(), self.config.vocab_size)

    def fuse(self, features: Tensor) -> Tensor:
        """Target features [B, n, len(aux_layers) * H_t] -> the head's input feature [B, n, H]."""
        return self.fc(features)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # [B, n, 2H] -> q, k, v [B, n, out]
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def project_out(self, x: Tensor) -> Tensor:  # [B, n, nh * D] -> [B, n, H]
        return self.o_proj(x)

    def mlp(self, x: Tensor) -> Tensor:  # [B, n, H] -> [B, n, H]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def project_logits(self, x: Tensor) -> Tensor:  # [B, n, H] -> [B, n, M]
        return self.lm_head(x)

    def forward(self, embeds: Tensor, hidden: Tensor, cos_sin: tuple[Tensor, Tensor],
                cache: HeadCache | None = None, mask: Tensor | None = None) -> tuple[Tensor, Tensor, HeadCache]:
        """One pass over n new positions (`head_pass`)."""
        return head_pass(self, embeds, hidden, cos_sin, cache, mask)

    def inference_form(self) -> PackedEagleHead:
        """The same head for drafting: its projections pre-packed for the few rows a draft step
        feeds (`PackedEagleHead`). Made after the head has its final device and dtype."""
        return PackedEagleHead(self)


class HeadLayer(Protocol):
    """What one head pass reads: the config, the norm weights [H] and the projections."""

    config: EagleConfig
    input_layernorm: Tensor
    hidden_norm: Tensor
    post_attention_layernorm: Tensor
    norm: Tensor

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...
    def project_out(self, x: Tensor) -> Tensor: ...
    def mlp(self, x: Tensor) -> Tensor: ...
    def project_logits(self, x: Tensor) -> Tensor: ...


def attention_inputs(p: HeadLayer, embeds: Tensor, hidden: Tensor,
                     cos_sin: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The head layer's attention inputs for n positions (arguments as `head_pass`): q [B, nh, n, D],
    k and v [B, kvh, n, D] (rotary applied to q and k) and the residual [B, n, H]."""
    c = p.config
    batch, n, _ = embeds.shape
    if c.norm_before_residual:
        normed = rms_norm(hidden, p.hidden_norm, c.rms_norm_eps)
        residual = normed
    else:
        normed, residual = rms_norm(hidden, p.hidden_norm, c.rms_norm_eps), hidden
    x = torch.cat([rms_norm(embeds, p.input_layernorm, c.rms_norm_eps), normed], dim=-1)  # [B, n, 2H]
    rope = rope_tables(*cos_sin)
    q, k, v = p.project_qkv(x)
    q = apply_rope(q.reshape(batch, n, c.num_heads, c.head_dim), *rope).transpose(1, 2)  # [B, nh, n, D]
    k = apply_rope(k.reshape(batch, n, c.num_kv_heads, c.head_dim), *rope).transpose(1, 2)  # [B, kvh, n, D]
    v = v.reshape(batch, n, c.num_kv_heads, c.head_dim).transpose(1, 2)  # [B, kvh, n, D]
    return q, k, v, residual


def head_keys(p: HeadLayer, embeds: Tensor, hidden: Tensor, cos_sin: tuple[Tensor, Tensor]) -> HeadCache:
    """The cache of n positions alone, without their outputs (arguments as `head_pass`): positions
    that later ones attend to but whose own drafts are never used (training: a prompt's anchors)."""
    _, k, v, _ = attention_inputs(p, embeds, hidden, cos_sin)
    return HeadCache(k, v)


def head_pass(p: HeadLayer, embeds: Tensor, hidden: Tensor, cos_sin: tuple[Tensor, Tensor],
              cache: HeadCache | None = None, mask: Tensor | None = None) -> tuple[Tensor, Tensor, HeadCache]:
    """One pass of the head's layer over n new positions: embeds [B, n, H] (the target's embedding
    of x_{j+1}), hidden [B, n, H] (fused target features or the head's own outputs), cos_sin: the
    target rotary embedding's (cos, sin) [B|1, n, D] at the positions. cache: keys/values of earlier
    positions (attended in full), or None. mask: an additive [n, L + n] or [B, 1, n, L + n] mask
    instead of the causal continuation (training-time test, trees). Returns (logits [B, n, M],
    pre-norm output [B, n, H] (the next step's `hidden`), the cache with these n appended)."""
    c = p.config
    batch, n, _ = embeds.shape
    q, k, v, residual = attention_inputs(p, embeds, hidden, cos_sin)
    if cache is not None and cache.length:
        k, v = torch.cat([cache.keys, k], dim=2), torch.cat([cache.values, v], dim=2)
    past = k.shape[2] - n
    causal = mask is None and past == 0 and n > 1
    if mask is None and past > 0 and n > 1:
        mask = continuation_mask(past, n, q.dtype, q.device)  # [n, L + n]
    att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                         enable_gqa=c.num_heads != c.num_kv_heads)  # [B, nh, n, D]
    a = p.project_out(att.transpose(1, 2).reshape(batch, n, c.num_heads * c.head_dim)) + residual
    out = p.mlp(rms_norm(a, p.post_attention_layernorm, c.rms_norm_eps)) + a  # [B, n, H] pre-norm
    logits = p.project_logits(rms_norm(out, p.norm, c.rms_norm_eps))  # [B, n, M]
    return logits, out, HeadCache(k, v)


class PackedEagleHead:
    """A trained head's inference form: the same `head_pass`, its projections frozen in the layout
    that is fastest for few rows (`specdraft.linear_formats.PackedLinear`; q/k/v and gate/up fused
    into one product each), so a draft step streams the head's weights at the speed the target's
    own layers get. Inference only (no gradients); call like the head."""

    def __init__(self, head: EagleHead) -> None:
        self.config = c = head.config
        self.input_layernorm = head.input_layernorm.detach()
        self.hidden_norm = head.hidden_norm.detach()
        self.post_attention_layernorm = head.post_attention_layernorm.detach()
        self.norm = head.norm.detach()
        self.dtype = head.fc.weight.dtype
        self._splits = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim)
        self._fc = PackedLinear(head.fc.weight, None)  # [H, F]
        self._qkv = PackedLinear(torch.cat([head.q_proj.weight, head.k_proj.weight, head.v_proj.weight]), None)
        self._out = PackedLinear(head.o_proj.weight, None)  # [H, nh * D]
        self._gate_up = PackedLinear(torch.cat([head.gate_proj.weight, head.up_proj.weight]), None)  # [2I, H]
        self._down = PackedLinear(head.down_proj.weight, None)  # [H, I]
        self._lm_head = PackedLinear(head.lm_head.weight, None)  # [M, H]

    def fuse(self, features: Tensor) -> Tensor:
        """Target features [B, n, len(aux_layers) * H_t] -> the head's input feature [B, n, H]."""
        return self._fc(features)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self._qkv(x).split(self._splits, dim=-1)
        return q, k, v

    def project_out(self, x: Tensor) -> Tensor:
        return self._out(x)

    def mlp(self, x: Tensor) -> Tensor:
        gate, up = self._gate_up(x).chunk(2, dim=-1)  # [B, n, I] each
        return self._down(F.silu(gate) * up)

    def project_logits(self, x: Tensor) -> Tensor:
        return self._lm_head(x)

    def __call__(self, embeds: Tensor, hidden: Tensor, cos_sin: tuple[Tensor, Tensor],
                 cache: HeadCache | None = None, mask: Tensor | None = None) -> tuple[Tensor, Tensor, HeadCache]:
        return head_pass(self, embeds, hidden, cos_sin, cache, mask)


def random_head(target: TargetModel, seed: int = 0, draft_ids: Sequence[int] | Tensor | None = None,
                aux_layers: Sequence[int] | None = None, std: float = 0.2) -> EagleHead:
    """A head with random weights (tests: a drafter that is partly right). draft_ids: the target
    ids of the draft vocabulary, in draft-id order (None = all V)."""
    ids = torch.arange(target.vocab_size) if draft_ids is None else torch.as_tensor(draft_ids).long()
    config = EagleConfig.for_target(target, int(ids.numel()), aux_layers)
    head = EagleHead(config, d2t=ids - torch.arange(ids.numel()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for p in head.parameters():
            nn.init.normal_(p, std=std) if p.dim() > 1 else nn.init.normal_(p, mean=1.0, std=0.05)
    return head.to(target.lm_head.weight.dtype).eval()


# ------------------------------------------------------------------------------------ the file
_LAYER_NAMES = {  # our parameter -> the speculators / vLLM weight name
    "fc.weight": "fc.weight", "input_layernorm": "midlayer.input_layernorm.weight",
    "hidden_norm": "midlayer.hidden_norm.weight", "post_attention_layernorm": "midlayer.post_attention_layernorm.weight",
    "q_proj.weight": "midlayer.self_attn.q_proj.weight", "k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "v_proj.weight": "midlayer.self_attn.v_proj.weight", "o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "gate_proj.weight": "midlayer.mlp.gate_proj.weight", "up_proj.weight": "midlayer.mlp.up_proj.weight",
    "down_proj.weight": "midlayer.mlp.down_proj.weight", "norm": "norm.weight", "lm_head.weight": "lm_head.weight",
}


def verifier_architectures(target: TargetModel) -> list[str]:
    """The target's Hugging Face architecture names as its config records them; a model built from
    a .gguf file has none recorded, so its model class names it (what `save_pretrained` writes)."""
    recorded = getattr(target.config, "architectures", None)
    return list(recorded) if recorded else [type(target.model).__name__]


def speculators_config(head: EagleHead, target: TargetModel, verifier: str, speculative_tokens: int,
                       provenance: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """config.json of the speculators EAGLE-3 format (module docstring)."""
    c, tc = head.config, target.config
    layer = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size, "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False,
    }
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):  # the target's rotary embedding, as it states it
        value = getattr(tc, key, None)
        if value is not None:
            layer[key] = value
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.1.0",
        "transformer_layer_config": layer, "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size, "norm_before_residual": c.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layers),
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures(target)},
        },
        RECORD_KEY: target_info(target),
        "specdraft": {"eagle_config": {**asdict(c), "aux_layers": list(c.aux_layers)}, **(provenance or {})},
    }


def save_head(head: EagleHead, out_dir: str | Path, target: TargetModel, verifier: str,
              speculative_tokens: int = 3, provenance: Mapping[str, Any] | None = None,
              dtype: torch.dtype = torch.float16) -> Path:
    """Write the head as a speculators EAGLE-3 directory (module docstring); float weights in
    `dtype`. Returns the directory."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(head.named_parameters())
    tensors = {name: params[ours].detach().to("cpu", dtype).contiguous() for ours, name in _LAYER_NAMES.items()}
    tensors["d2t"] = head.d2t.detach().cpu().long().contiguous()
    t2d = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    t2d[head.vocab().ids] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = speculators_config(head, target, verifier, speculative_tokens, provenance)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
    return out


def load_head(head_dir: str | Path, target: TargetModel | None = None) -> EagleHead:
    """Read a speculators EAGLE-3 directory (ours, or one written by SpecForge / speculators for
    a Llama-family target) into an `EagleHead` in the target's dtype, after checking that it was
    made for `target` (a named error, not a size mismatch). head_dir: a directory, or a shipped
    head: a target alias ("smollm2-135m" -> its `eagle` artifact) or `<alias>/<name>`."""
    from safetensors.torch import load_file

    path = require_artifact(head_dir, "EAGLE-3 head", default=DEFAULT_ARTIFACT)
    config_file = path / CONFIG_FILE
    if not config_file.is_file() or not (path / WEIGHTS_FILE).is_file():
        raise ValueError(f"{path} is not an EAGLE-3 head directory: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
                         "(write one with specdraft-train-eagle).")
    raw = json.loads(config_file.read_text())
    if raw.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{config_file} is not an EAGLE-3 speculator config (speculators_model_type "
                         f"{raw.get('speculators_model_type')!r}, expected 'eagle3').")
    record = read_record(config_file)
    if target is not None and record is not None:
        check_target(record, target, f"the EAGLE-3 head in {path}", HEAD_KEYS,
                     fix="Train a head for this target with specdraft-train-eagle.")
    layer = raw["transformer_layer_config"]
    heads = int(layer["num_attention_heads"])
    config = EagleConfig(
        hidden_size=int(layer["hidden_size"]), target_hidden_size=int(raw.get("target_hidden_size") or layer["hidden_size"]),
        num_heads=heads, num_kv_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or int(layer["hidden_size"]) // heads),
        intermediate_size=int(layer["intermediate_size"]), rms_norm_eps=float(layer["rms_norm_eps"]),
        vocab_size=int(layer["vocab_size"]), draft_vocab_size=int(raw.get("draft_vocab_size") or layer["vocab_size"]),
        aux_layers=tuple(int(j) for j in raw["eagle_aux_hidden_state_layer_ids"]),
        max_position_embeddings=int(layer.get("max_position_embeddings", 0)),
        norm_before_residual=bool(raw.get("norm_before_residual", True)),  # the speculators default
    )
    tensors = load_file(str(path / WEIGHTS_FILE))
    missing = [name for name in list(_LAYER_NAMES.values()) + ["d2t"] if name not in tensors]
    if missing:
        raise ValueError(f"{path / WEIGHTS_FILE} lacks {missing}; is it an EAGLE-3 head with one mid layer?")
    head = EagleHead(config, d2t=tensors["d2t"])
    head.load_state_dict({ours: tensors[name] for ours, name in _LAYER_NAMES.items()} | {"d2t": tensors["d2t"]})
    dtype = target.lm_head.weight.dtype if target is not None else torch.float32
    device = target.device if target is not None else torch.device("cpu")
    return head.to(device=device, dtype=dtype).eval()
