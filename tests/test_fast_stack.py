"""The fast layer stack (packed weights, preallocated KV cache) against the plain HF forward."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

from drafters.ngram import NGramDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.fast_stack import continuation_mask
from specdraft.models import tiny_random_llama, tiny_random_target
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from tests.helpers import plain_greedy


def gqa_target(fast: bool | str = True, **kwargs: int) -> TargetModel:
    """Vocab 16, 3 layers, 4 query heads sharing 2 K/V heads (grouped-query attention)."""
    return tiny_random_target(vocab_size=16, seed=3, num_layers=3, num_kv_heads=2, fast=fast, **kwargs)


@torch.inference_mode()
def reference_logits(target: TargetModel, ids: list[int], k: int) -> torch.Tensor:
    """Logits [1, k, V] of the last k positions from one plain HF forward, no cache."""
    return target.model(torch.tensor([ids])).logits[:, -k:].float()


@torch.inference_mode()
def reference_cache(target: TargetModel, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cache = DynamicCache(config=target.config)
    target.model(torch.tensor([ids]), cache=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


def test_default_is_fast_for_llama_and_plain_stays_available() -> None:
    assert tiny_random_target().fast is True
    assert tiny_random_target(fast=False).fast is False


def test_logits_match_plain_forward_through_verify_and_rollback() -> None:
    """k = 1..16 new positions after arbitrary earlier verify + rollback sequences (k > 1: the
    grouped verify attention, 4 query heads over 2 K/V heads)."""
    target = gqa_target()
    gen = torch.Generator().manual_seed(0)
    committed = torch.randint(0, 16, (9,), generator=gen).tolist()
    target.reset()
    target.forward(torch.tensor([committed]), num_logits=0)
    for k in list(range(1, 17)) + list(range(16, 0, -3)):
        new = torch.randint(0, 16, (k,), generator=gen).tolist()
        out = target.forward(torch.tensor([new]))
        torch.testing.assert_close(out.logits, reference_logits(target, committed + new, k), rtol=1e-4, atol=1e-4)
        keep = int(torch.randint(0, k + 1, (1,), generator=gen))  # accepted prefix of the block
        committed += new[:keep]
        target.crop(len(committed))
        assert target.cache_length == len(committed)


def test_rollback_leaves_the_cache_of_a_fresh_forward() -> None:
    target = gqa_target()
    prompt = [1, 5, 2, 7, 3, 3, 9]
    target.reset()
    target.forward(torch.tensor([prompt]), num_logits=0)
    target.forward(torch.tensor([[4, 4, 8, 1, 0]]))
    target.crop(len(prompt) + 2)
    target.forward(torch.tensor([[6, 2, 2]]))
    target.crop(len(prompt) + 3)
    kept = prompt + [4, 4, 6]
    for (k, v), (k_ref, v_ref) in zip(target.cache_tensors(), reference_cache(target, kept), strict=True):
        torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v_ref, rtol=1e-5, atol=1e-5)


def test_buffer_grows_past_its_first_capacity() -> None:
    """The preallocated buffer starts at 256 positions and grows (one copy) without losing data."""
    target = gqa_target(max_position_embeddings=1024)
    ids = torch.randint(0, 16, (1, 300), generator=torch.Generator().manual_seed(1)).tolist()[0]
    target.reset()
    target.forward(torch.tensor([ids[:250]]), num_logits=0)
    out = target.forward(torch.tensor([ids[250:]]))  # crosses 256
    torch.testing.assert_close(out.logits, reference_logits(target, ids, 50), rtol=1e-4, atol=1e-4)


def test_continuation_mask_opens_the_cache_and_the_block_causally() -> None:
    mask = continuation_mask(2, 3, torch.float32, torch.device("cpu"))  # [3, 5]
    inf = float("-inf")
    want = torch.tensor([[0, 0, 0, inf, inf], [0, 0, 0, 0, inf], [0, 0, 0, 0, 0]])
    assert torch.equal(mask, want)
    grouped = continuation_mask(2, 3, torch.float32, torch.device("cpu"), groups=2)  # [6, 5]
    assert torch.equal(grouped, torch.cat([want, want]))


def test_a_prompt_prefilled_at_once_or_in_pieces_gives_the_same_logits() -> None:
    """A prefill (empty cache: SDPA's causal mode) and a continuation (explicit mask) agree."""
    target = gqa_target()
    ids = torch.randint(0, 16, (1, 40), generator=torch.Generator().manual_seed(4))
    target.reset()
    whole = target.forward(ids).logits  # [1, 40, V]
    target.reset()
    first = target.forward(ids[:, :25]).logits
    rest = target.forward(ids[:, 25:]).logits
    torch.testing.assert_close(torch.cat([first, rest], dim=1), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole, reference_logits(target, ids[0].tolist(), 40), rtol=1e-4, atol=1e-4)


def test_context_overflow_is_a_clear_error() -> None:
    target = gqa_target(max_position_embeddings=32)
    target.reset()
    target.forward(torch.tensor([[1] * 30]), num_logits=0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        target.forward(torch.tensor([[1, 2, 3]]))
    assert target.cache_length == 30  # nothing was written: the cache is still usable
    assert target.forward(torch.tensor([[1, 2]])).logits.shape == (1, 2, 16)


@pytest.mark.parametrize("num_draft_tokens", [1, 4, 8])
def test_greedy_through_fast_path_equals_plain_greedy(num_draft_tokens: int) -> None:
    target = gqa_target()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    want = plain_greedy(target, prompt, 40)
    dec = SpeculativeDecoder(target, NGramDrafter(max_ngram=2), num_draft_tokens, SamplingConfig())
    assert dec.generate(prompt, 40, stop_token_ids=[]).token_ids[0].tolist() == want


def test_fast_and_plain_targets_agree_token_for_token() -> None:
    prompt = [2, 7, 1, 8, 2, 8]
    outs = []
    for fast in (True, False):
        dec = SpeculativeDecoder(gqa_target(fast=fast), NGramDrafter(), 4, SamplingConfig())
        outs.append(dec.generate(prompt, 30, stop_token_ids=[]).token_ids[0].tolist())
    assert outs[0] == outs[1]


def test_unsupported_architecture_falls_back_or_says_why() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=16, n_positions=64)).eval()
    assert TargetModel(gpt2).fast is False  # auto: the plain HF path
    with pytest.raises(ValueError, match="target.fast"):
        TargetModel(gpt2, fast=True)
    with pytest.raises(ValueError, match="true, false or 'auto'"):
        TargetModel(tiny_random_llama(), fast="yes")


def test_quantized_projections_are_not_packed() -> None:
    """A model whose projections are not float nn.Linear (e.g. bitsandbytes) stays on the plain path."""
    model = tiny_random_llama()
    layer = model.model.layers[0].mlp
    layer.down_proj = torch.nn.Sequential(layer.down_proj)  # stands in for a quantized module
    assert TargetModel(model).fast is False


def test_a_quantized_copy_runs_on_the_plain_stack_and_an_exact_copy_on_the_fast_one() -> None:
    """`TargetModel(fast="auto")` is how the quantized drafter runs its copy: quantized layers (torch
    dynamic int8, bitsandbytes) fall back to the HF stack, the unquantized copy keeps the fast one."""
    from drafters.quantized import quantized_copy
    from specdraft.fast_stack import fast_path_unsupported

    model = tiny_random_llama()
    for backend in ("torch", "bitsandbytes"):
        copy = quantized_copy(model, 8, backend=backend)
        assert "quantized?" in (fast_path_unsupported(copy) or "") and TargetModel(copy).fast is False
    assert TargetModel(quantized_copy(model, 16)).fast is True


def test_static_forward_matches_dynamic_forward_after_rollback() -> None:
    """`run_static` (what a CUDA graph captures: fixed shapes, attention over the whole buffer with
    a position mask) computes what the dynamic path computes, stale rejected K/V included."""
    from specdraft.fast_stack import FastStack

    model = gqa_target().model
    static, dynamic = FastStack(model), FastStack(model)
    prompt = torch.tensor([[1, 5, 2, 7, 3, 3, 9, 4]])
    for stack in (static, dynamic):
        stack.reset()
        stack.kv.reserve(48)
        stack.forward(prompt)
        stack.forward(torch.tensor([[6, 6, 6, 6]]))  # a draft block ...
        stack.crop(9, stack.num_layers)  # ... of which one token was accepted
    new = torch.tensor([[2, 8, 1]])
    got = static.run_static(new, torch.tensor([9]))
    want, _ = dynamic.forward(new)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_cuda_graphs_need_cuda() -> None:
    assert tiny_random_target().cuda_graphs is False  # auto: off on CPU
    with pytest.raises(ValueError, match="CUDA"):
        TargetModel(tiny_random_llama(), cuda_graphs=True)


def test_graphs_are_used_only_where_a_captured_shape_is_valid() -> None:
    """The CUDA-graph bookkeeping (which forwards may replay a graph) on CPU; capture needs CUDA."""
    from specdraft.cuda_graphs import VerifyGraphs
    from specdraft.fast_stack import FastStack

    stack = FastStack(gqa_target(max_position_embeddings=40).model)
    stack.reset()
    assert stack.kv.capacity == 40
    graphs = VerifyGraphs(stack, max_positions=4, capacity=40)
    stack.forward(torch.tensor([[1] * 30]))
    assert graphs.usable(torch.tensor([[1, 2, 3, 4]]))
    assert not graphs.usable(torch.tensor([[1] * 5]))  # longer than any captured k: eager
    stack.forward(torch.tensor([[1] * 4]))  # 34 cached: 34 + 3 would reach the scratch slots
    assert not graphs.usable(torch.tensor([[1, 2, 3]]))
    stack.crop(30, 1)  # only the first layer rolled back (early-exit style): eager
    assert not graphs.usable(torch.tensor([[1]]))


def test_keep_positions_after_the_buffer_grew_inside_a_forward() -> None:
    """Tree verification copies the accepted path into place; the buffers it writes may have been
    (re)allocated inside a forward (inference tensors). Found by the Medusa tree bench."""
    target = gqa_target(max_position_embeddings=1024)
    ids = torch.randint(0, 16, (1, 300), generator=torch.Generator().manual_seed(2)).tolist()[0]
    target.reset()
    target.forward(torch.tensor([ids]), num_logits=0)  # grows 256 -> 512 inside inference mode
    keep = list(range(290)) + [293, 297]
    target.keep_positions(keep)
    assert target.cache_length == 292
    out = target.forward(torch.tensor([[1]]))
    assert out.logits.shape == (1, 1, 16) and [k.shape[2] for k, _ in target.cache_tensors()] == [293] * 3
