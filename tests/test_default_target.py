"""The real default target (SmolLM2-135M-Instruct): loading, greedy exactness, stop tokens."""

from __future__ import annotations

import pytest

from drafters.ngram import NGramDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.target import TargetModel
from tests.helpers import plain_greedy

pytestmark = pytest.mark.slow

CODE_PROMPT = (
    "Rename the variable `total` to `acc` in this function and return the whole function:\n\n"
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(values)\n"
)


def chat_ids(target: TargetModel, text: str) -> list[int]:
    return target.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )


def test_default_target_facts(default_target: TargetModel) -> None:
    assert default_target.vocab_size == 49152
    assert default_target.num_layers == 30 and default_target.hidden_size == 576
    assert default_target.eos_token_ids  # <|im_end|>
    assert len(default_target.tokenizer) == 49152


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_exact_on_default_target(default_target: TargetModel, k: int) -> None:
    prompt = chat_ids(default_target, CODE_PROMPT)
    ref = plain_greedy(default_target, prompt, 40)
    out = SpeculativeDecoder(default_target, NGramDrafter(1, 3), k).generate(
        prompt, 40, stop_token_ids=[]
    )
    assert out.token_ids[0].tolist() == ref
    assert out.stats.accepted > 0  # the code prompt is copy-heavy


def test_eos_ends_generation(default_target: TargetModel) -> None:
    prompt = chat_ids(default_target, "Say only the word yes.")
    out = SpeculativeDecoder(default_target, NGramDrafter(), 4).generate(prompt, 60)
    toks = out.token_ids[0].tolist()
    assert toks[-1] in default_target.eos_token_ids
    assert not set(toks[:-1]) & set(default_target.eos_token_ids)
    assert toks == plain_greedy(default_target, prompt, 60, default_target.eos_token_ids)
