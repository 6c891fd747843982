"""K per draft source vs one pooled K policy, side by side on the same prompts.

    .venv/bin/python benchmarks/k_per_source.py [--drafters medusa,medusa_recurrent,eagle,early_exit] [--limit 2]

A copy-first drafter (`drafters/copy_first.py`) drafts from two sources, a copy where the context repeats and its
model elsewhere; under `num_draft_tokens=auto` the decoder sizes each with its own cost model
(`specdraft.draft_length.PerSourceDraftLength`). The ablation is the policy before that: one cost model for every
round, pooling both sources' acceptance, at the model's measured cost per token. Per prompt (the first turn of the
first --limit prompts of every category of the held-out `general` suite, greedy, --max-new-tokens), AR, the
per-source decoder and the pooled one run one after another (this machine is shared and noisy: the paired
per-prompt ratio is the number to read), and their outputs must be identical.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from specdraft import costs
from specdraft.build import drafter_config, make_decoder, make_drafter
from specdraft.cpu_info import cpu_description
from specdraft.draft_length import make_draft_length_policy
from specdraft.suites import by_category, chat_prompt_ids, load_suite


def first_turns(tokenizer, limit: int) -> list[list[int]]:  # noqa: ANN001 - a transformers tokenizer
    """Token ids of the first user turn of the first `limit` prompts of every `general` category."""
    prompts = [p for group in by_category(load_suite("general")).values() for p in group[:limit]]
    ids = []
    for p in prompts:
        if p.messages:
            messages = [m.as_dict() for m in p.messages]
        else:
            messages = [{"role": "user", "content": p.turns[0] if p.turns else p.prompt}]
        ids.append(chat_prompt_ids(tokenizer, messages))
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafters", default="medusa,medusa_recurrent,eagle,early_exit")
    parser.add_argument("--limit", type=int, default=2, help="prompts per category of the general suite")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("bench", overrides=["suite=general"])
    target = instantiate(cfg.target)
    plain = make_decoder(cfg, target, None)
    prompts = first_turns(target.tokenizer, args.limit)
    print(f"{cpu_description()}, {args.threads} threads; {len(prompts)} prompts, {args.max_new_tokens} new tokens, greedy")
    print("| drafter | sources | per-source / pooled (paired median) | geometric mean | per-source vs AR (median) "
          "| pooled vs AR (median) | rounds per-source / pooled |")
    print("|---|---|---|---|---|---|---|")
    for name in args.drafters.split(","):
        spec = drafter_config(name)
        per_source = make_decoder(cfg, target, make_drafter(spec), spec)
        pooled = make_decoder(cfg, target, make_drafter(spec), spec)
        sources = per_source.drafter.draft_sources if per_source.drafter is not None else ()
        if len(sources) < 2:
            raise ValueError(f"{name} drafts from one source ({sources}); pick a copy-first drafter.")
        per_source.generate(prompts[0], 8)  # measures the costs (outside the timings)
        model_cost = per_source.draft_costs_per_token(per_source.sampling)[-1]
        curve = costs.verify_curve(target, per_source.max_draft_tokens)
        pooled.new_policy = lambda sampling=None, batch_size=1: make_draft_length_policy(  # type: ignore[method-assign]
            "auto", per_source.max_draft_tokens, curve, model_cost)
        pooled._row_sources = lambda ctx: None  # type: ignore[method-assign]  # every round is one source
        a_ratios, b_ratios, rounds = [], [], [0, 0]
        for ids in prompts:
            ar = plain.generate(ids, args.max_new_tokens).stats.tokens_per_s
            a, b = per_source.generate(ids, args.max_new_tokens), pooled.generate(ids, args.max_new_tokens)
            if a.token_ids.tolist() != b.token_ids.tolist():
                raise AssertionError(f"{name}: the two policies gave different greedy outputs")
            a_ratios.append(a.stats.tokens_per_s / ar)
            b_ratios.append(b.stats.tokens_per_s / ar)
            rounds[0] += a.stats.rounds
            rounds[1] += b.stats.rounds
        paired = [x / y for x, y in zip(a_ratios, b_ratios)]
        geo = math.exp(statistics.mean(math.log(r) for r in paired))
        print(f"| {name} | {', '.join(sources)} | {statistics.median(paired):.3f} | {geo:.3f} | "
              f"{statistics.median(a_ratios):.2f}x | {statistics.median(b_ratios):.2f}x | {rounds[0]} / {rounds[1]} |",
              flush=True)


if __name__ == "__main__":
    main()
