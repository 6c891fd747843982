"""The per-round host work of the decoding loop, the fast target and the n-gram drafter does not
grow with the context: operations are counted (dispatched torch ops, elements written by copying
ops, executed Python lines), never timed. The attention itself reads the whole cache; that is the
one cost that should grow, and it is a single op whatever the length."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from drafters.ngram import NGramDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel

SHORT, LONG = 256, 2048
# Ops whose outputs are copies of their inputs: a per-round copy of the cache would show here.
COPY_OPS = {
    "copy_", "cat", "stack", "clone", "_to_copy", "index_select", "index_copy", "index_copy_",
    "index", "index_put_", "repeat", "repeat_interleave", "expand_copy", "slice_scatter", "contiguous",
}


@dataclass
class Work:
    """What a piece of code did: aten ops by name, elements written by copying ops, Python lines."""

    ops: Counter[str] = field(default_factory=Counter)
    copied: int = 0
    lines: int = 0

    def __sub__(self, other: Work) -> Work:
        ops = Counter(self.ops)
        ops.subtract(other.ops)
        return Work(+ops, self.copied - other.copied, self.lines - other.lines)


class _OpCounter(TorchDispatchMode):
    def __init__(self, work: Work) -> None:
        super().__init__()
        self.work = work

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.work.ops[name] += 1
        if name in COPY_OPS:
            self.work.copied += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out


@contextmanager
def _line_counter(work: Work) -> Iterator[None]:
    previous = sys.gettrace()

    def trace(frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        if event == "line":
            work.lines += 1
        return trace

    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


def measure(run: Callable[[], object]) -> Work:
    """The torch ops and copied elements of `run()`, then (a second call) its Python lines."""
    work = Work()
    with _OpCounter(work):
        run()
    with _line_counter(work):
        run()
    return work


def long_target() -> TargetModel:
    """Tiny grouped-query Llama on the fast stack, with room for the long context."""
    return tiny_random_target(vocab_size=64, seed=5, num_layers=2, num_heads=4, num_kv_heads=2,
                              max_position_embeddings=4096)


def tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(1, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_verify_forward_does_the_same_work_at_any_context() -> None:
    """k new positions after 256 or 2048 cached ones: the same ops, the same copied elements."""
    target = long_target()
    assert target.fast
    context = tokens(LONG + 16)
    for k in (1, 6):
        target.reset()
        target.forward(torch.tensor([context]), num_logits=0)  # the buffer is as large as it gets
        new = torch.tensor([context[LONG : LONG + k]])

        def verify_round(length: int, block: torch.Tensor = new) -> Callable[[], object]:
            def run() -> None:
                target.crop(length)
                target.forward(block)
                target.crop(length)
            return run

        long = measure(verify_round(LONG))  # first: a crop to SHORT forgets the positions beyond it
        short = measure(verify_round(SHORT))
        assert short.ops == long.ops, f"k={k}: {short.ops - long.ops} vs {long.ops - short.ops}"
        assert short.copied == long.copied
        assert short.lines == long.lines
        assert short.ops["scaled_dot_product_attention"] == target.num_layers  # one attention op per layer


def test_each_ar_round_of_the_loop_does_the_same_work_at_any_context() -> None:
    """The work of 8 extra rounds (generate 12 - generate 4 tokens: the prefill cancels) is the
    same after a 256- and a 2048-token prompt."""
    target = long_target()
    decoder = SpeculativeDecoder(target, None)
    prompt = tokens(LONG)
    decoder.generate(prompt, 12, stop_token_ids=[])  # the cache buffer grows here, not below

    def rounds(length: int) -> Work:
        return (measure(lambda: decoder.generate(prompt[:length], 12, stop_token_ids=[]))
                - measure(lambda: decoder.generate(prompt[:length], 4, stop_token_ids=[])))

    short, long = rounds(SHORT), rounds(LONG)
    assert short.ops == long.ops
    assert short.copied == long.copied
    assert short.lines == long.lines
    assert short.ops["scaled_dot_product_attention"] == 8 * target.num_layers


def test_ngram_rounds_do_the_same_work_at_any_context() -> None:
    """After the index has caught up on the prompt, a round (propose 5 + commit 3 new tokens) costs
    the same lines and ops after 256 and 2048 tokens of context."""
    period = tokens(50, seed=1)
    text = (period * (LONG // 50 + 2))[: LONG + 30]  # repetitive: every lookup finds a match
    settings = SamplingConfig()

    def rounds(length: int) -> Work:
        drafter = NGramDrafter(min_ngram=1, max_ngram=3)
        gen = torch.Generator()
        committed = torch.tensor([text[: length + 30]])  # [1, T]

        def ctx(n: int) -> DraftContext:
            return DraftContext(committed[:, :n], None, settings, gen)

        drafter.reset()
        drafter.propose(ctx(length), 5)  # the first round indexes the whole prompt

        def run() -> None:
            drafter.reset()
            drafter.propose(ctx(length), 5)
            for r in range(1, 8):
                drafter.commit(ctx(length + 3 * r), [2])
                drafter.propose(ctx(length + 3 * r), 5)

        def first() -> None:
            drafter.reset()
            drafter.propose(ctx(length), 5)

        return measure(run) - measure(first)

    short, long = rounds(SHORT), rounds(LONG)
    assert short.lines > 0
    assert short.lines == long.lines
    assert short.ops == long.ops
    assert short.copied == long.copied
