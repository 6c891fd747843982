"""Repeated random sequences: a synthetic copying task meant to give a small draft an induction head.

The target copies from its context (a list shown again, an email rewritten, its own greedy loops):
it has induction heads (layers 17 and 18 of SmolLM2-135M attend from a repeated token to the
token after its earlier occurrence; RESULTS §3n). A draft made of the target's first two layers
has none (it copies 0% of a repeated random sequence), and distillation on natural text, even on
chats that repeat an answer (`copy_chats`), did not make one in 40 minutes (§3m); our reading: in natural
text bigram statistics predict most repeated tokens too, so the gradient towards looking back is weak.

On a repeated sequence of random tokens [a; a] nothing but looking back predicts the second half,
so they are the plainest signal towards an induction head. They are training data for the
distillation recipe (`data.repeats=N`): their "teacher" distribution is one-hot on the copied
token (the correct continuation of an exact repeat; the target itself puts its argmax there on
84% of such positions) and only the second copy's positions are trained.

Measured (RESULTS §3n): with one fixed span the 2-layer draft learned a positional shortcut (copy
the token `span` positions back), not induction; with spans that vary (as here), 500 steps of the
copy cross-entropy alone did not form an induction head. `induction_warmup` adds attention
supervision: from the shipped draft it copied ~90% at every span after 600 steps in one run; in the
recipe, from untrained layers (1100 steps) and from the shipped draft (600 steps), the attention
formed but the copying did not, and the answer model got much worse. Not used by the shipped draft.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import torch
from torch import Tensor
from transformers import LlamaForCausalLM

from specdraft.train.distill import Example, student_sub_logits
from specdraft.vocab import PrunedVocab


def repeat_sequences(pool: Tensor, count: int, min_span: int, max_span: int, seed: int) -> list[Tensor]:
    """`count` sequences [a; a], each [2 * span] int64 with span drawn uniformly from
    [min_span, max_span] and a = span tokens drawn uniformly from `pool` ([P] target token ids),
    with a torch generator seeded by `seed`. The span varies so that "copy the token span positions
    back" does not solve the task: with one fixed span a draft learned exactly that shortcut (it
    copied 99.8% at the trained span 64 and 0% at span 40; RESULTS §3n)."""
    if count < 0 or not 2 <= min_span <= max_span:
        raise ValueError(f"repeated sequences need count >= 0 and 2 <= min_span <= max_span, got count={count}, "
                         f"min_span={min_span}, max_span={max_span}; set data.repeats / data.repeat_min_span / "
                         "data.repeat_max_span accordingly.")
    if pool.numel() < 2:
        raise ValueError("the token pool for repeated sequences needs at least 2 tokens.")
    g = torch.Generator().manual_seed(seed)
    spans = torch.randint(min_span, max_span + 1, (count,), generator=g)  # [N]
    out = []
    for span in spans.tolist():
        a = pool[torch.randint(0, pool.numel(), (span,), generator=g)]  # [S]
        out.append(torch.cat([a, a]))  # [2S]
    return out


def repeat_examples(pool: Tensor, count: int, min_span: int, max_span: int, top_k: int, seed: int) -> list[Example]:
    """Training examples from `repeat_sequences`: positions span .. 2*span-2 of the second copy,
    each with a one-hot teacher on the copied next token (top-k values [0, -inf, ...], all k
    indices that token, so the examples batch with real teacher top-k of the same k)."""
    out = []
    for ids in repeat_sequences(pool, count, min_span, max_span, seed):
        span = len(ids) // 2
        positions = torch.arange(span, 2 * span - 1)  # [S-1] predicts ids[t + 1] = a[t + 1 - span]
        values = torch.full((span - 1, top_k), float("-inf"), dtype=torch.float16)  # [S-1, k]
        values[:, 0] = 0.0
        labels = ids[positions + 1]  # [S-1]
        out.append(Example(ids, positions, values, labels[:, None].expand(-1, top_k).clone()))
    return out


def token_pool(vocab_ids: Tensor, size: int, exclude: Collection[int]) -> Tensor:
    """The `size` first ids of a frequency-ordered pruned vocabulary, leaving out `exclude`
    (end-of-sequence and chat special tokens): the tokens repeated sequences are drawn from."""
    keep = [int(t) for t in vocab_ids.tolist() if int(t) not in set(exclude)][:size]
    return torch.tensor(keep, dtype=torch.long)  # [P]


def _attention_heads(student: LlamaForCausalLM, seqs: Tensor) -> tuple[int, int]:
    """(previous-token head of the second-to-last layer, induction head of the last layer): the
    head of layer L-2 that already attends most to the previous token, and the head of layer L-1
    that attends to it least (so the induction head is not taken from an existing circuit)."""
    with torch.inference_mode():
        att = student.model(input_ids=seqs, output_attentions=True, use_cache=False).attentions
    r = torch.arange(1, seqs.shape[1])
    prev = [a[:, :, r, r - 1].mean(dim=(0, 2)) for a in att[-2:]]  # 2 x [H]
    return int(prev[0].argmax()), int(prev[1].argmin())


def copy_accuracy(student: LlamaForCausalLM, head: Tensor, vocab: PrunedVocab, seqs: Sequence[Tensor]) -> float:
    """Fraction of second-copy positions (span .. 2*span-2) where the student's top-1 is the copied token."""
    hits = total = 0
    with torch.inference_mode():
        for ids in seqs:
            span = len(ids) // 2
            pred = vocab.to_target(student_sub_logits(student, ids[None], head)[0].argmax(-1))  # [2S]
            hits += int((pred[span:-1] == ids[span + 1 :]).sum())
            total += span - 1
    return hits / max(total, 1)


def induction_warmup(
    student: LlamaForCausalLM, vocab: PrunedVocab, pool: Tensor, steps: int, min_span: int, max_span: int,
    lr: float = 1e-3, batch: int = 8, seed: int = 0, log: bool = True,
) -> dict:
    """Teach the student to copy before distillation: `steps` AdamW steps on repeated random
    sequences (one span per batch, drawn from [min_span, max_span]) minimising the cross-entropy
    of the copied token PLUS -log of two attention weights: a head of layer L-2 on the previous
    token and a head of layer L-1 on the token after the current token's first occurrence. The two
    heads are an induction circuit; told where to look, the shipped 2-layer draft copied ~90% of a
    repeat at every span after 600 steps of batch 8 in one run, while the cross-entropy alone made
    no progress in 500 steps; the step at which copying appears varies, and these updates to every
    layer weight cost the answer model (RESULTS §3n). Trains the parameters that require grad, in
    place; returns what it did (steps, heads, held-out copy accuracy, seconds).
    """
    from torch.nn.functional import cross_entropy

    if len(student.model.layers) < 2:
        raise ValueError("the induction warm-up needs a draft of at least 2 layers (an induction circuit "
                         "spans two); set data.induction_warmup_steps=0.")
    impl = student.config._attn_implementation
    student.set_attn_implementation("eager")  # attention weights are returned by eager attention only
    head = vocab.head(student.lm_head.weight)  # [M, H]
    g = torch.Generator().manual_seed(seed)
    probe = torch.stack(repeat_sequences(pool, 8, max_span, max_span, seed + 7))  # [8, 2S]
    h_prev, h_ind = _attention_heads(student, probe)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    t0 = time.time()
    student.train()
    for step in range(steps):
        span = int(torch.randint(min_span, max_span + 1, (), generator=g))
        ids = pool[torch.randint(0, pool.numel(), (batch, span), generator=g)].repeat(1, 2)  # [B, 2S]
        out = student.model(input_ids=ids, output_attentions=True, use_cache=False)
        logits = out.last_hidden_state[:, span:-1] @ head.T  # [B, S-1, M]
        ce = cross_entropy(logits.flatten(0, 1), vocab.to_subset(ids[:, span + 1 :]).flatten())
        r, q = torch.arange(1, 2 * span), torch.arange(span, 2 * span)
        to_prev = out.attentions[-2][:, h_prev, r, r - 1]  # [B, 2S-1]
        to_next = out.attentions[-1][:, h_ind, q, q - span + 1]  # [B, S]
        loss = ce - to_prev.clamp_min(1e-6).log().mean() - to_next.clamp_min(1e-6).log().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if log and (step + 1) % 100 == 0:
            print(f"[distill] induction warm-up step {step + 1}/{steps}: copy loss {ce.item():.3f}, attention "
                  f"to previous {to_prev.mean().item():.2f}, to next {to_next.mean().item():.2f}", flush=True)
    student.eval()
    held_out = repeat_sequences(pool, 16, min_span, max_span, seed + 1)
    result = {"steps": steps, "heads": {"previous_token": [len(student.model.layers) - 2, h_prev],
                                        "induction": [len(student.model.layers) - 1, h_ind]},
              "copy_accuracy": copy_accuracy(student, head, vocab, held_out), "seconds": round(time.time() - t0, 1)}
    student.set_attn_implementation(impl)
    return result
