"""Benchmark the shipped distilled draft (`DraftModelDrafter`) on the default target.

Prints, in one run and side by side:
  * greedy acceptance on chat/QA-like prompts (SpeculativeDecoder, K draft tokens),
  * expected acceptance sum_x min(p, q) at temperature 1 on the held-out corpus split and on
    held-out self-generated answers,
  * wall time of plain AR decoding (the same SpeculativeDecoder with K = 0), speculative decoding,
    and Hugging Face assisted generation (`generate(assistant_model=...)`) with the same draft;
    runs are interleaved prompt by prompt so background load hits all three alike,
  * whether all greedy outputs are identical, and the draft's per-token propose cost with the
    pruned and the full vocabulary head.

    OMP_NUM_THREADS=1 python benchmarks/draft_model.py --max-new-tokens 96 --k 2,3 --out benchmarks/draft_model.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from drafters.draft_model import DraftModelDrafter, load_draft_hf_model
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel

PROMPTS = {
    "chat": [
        "Give me three tips for writing readable code.",
        "Write a short, friendly email inviting my team to a planning meeting on Friday.",
        "How should I prepare for a job interview as a software developer?",
    ],
    "qa": [
        "What is the difference between a list and a tuple in Python?",
        "How do I read a text file line by line in Python?",
        "What is a hash table and why are lookups fast?",
    ],
}


def chat_ids(target: TargetModel, text: str) -> list[int]:
    enc = target.tokenizer.apply_chat_template(  # type: ignore[union-attr]
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def timed(fn):  # noqa: ANN001, ANN201
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def hf_assisted(target: TargetModel, assistant: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = target.model.generate(
            ids, attention_mask=torch.ones_like(ids), assistant_model=assistant, do_sample=False,
            max_new_tokens=n, pad_token_id=target.tokenizer.pad_token_id,  # type: ignore[union-attr]
            eos_token_id=target.eos_token_ids,
        )
    return out[0, len(prompt) :].tolist()


def propose_cost(target: TargetModel, drafter: DraftModelDrafter, prompt: list[int], k: int, reps: int) -> float:
    """Seconds per drafted token (fresh cache each rep, prompt prefilled outside the timing)."""
    ctx = DraftContext(torch.tensor([prompt]), None, SamplingConfig(), torch.Generator())
    total = 0.0
    for _ in range(reps):
        drafter.reset()
        drafter.propose(ctx, 1)  # prefill the draft cache
        drafter.commit(ctx, 0)
        _, dt = timed(lambda: drafter.propose(ctx, k))
        total += dt
    return total / (reps * k)


def heldout_expected_acceptance(target: TargetModel, drafter: DraftModelDrafter, corpus_tokens: int, answers: int) -> dict:
    """Greedy agreement and sum min(p, q) at T=1 on the corpus eval split and held-out answers."""
    from specdraft.data import corpus_documents, token_blocks
    from specdraft.train.distill import evaluate, make_eval_set
    from specdraft.train.selfgen import load_selfgen_records

    vocab = drafter.vocab
    assert vocab is not None and drafter.model is not None
    head = vocab.head(drafter.model.get_output_embeddings().weight)
    blocks = token_blocks(target.tokenizer, corpus_documents("eval"), 256, corpus_tokens)
    out = {"corpus (held-out stdlib/pydoc)": evaluate(drafter.model, head, vocab, make_eval_set(target, list(blocks), [0] * len(blocks), vocab))}
    recs = load_selfgen_records("eval")[:answers]
    seqs = [torch.tensor(r["prompt_ids"] + r["completion_ids"]) for r in recs]
    ev = make_eval_set(target, seqs, [len(r["prompt_ids"]) - 1 for r in recs], vocab)
    out["held-out self-generated answers"] = evaluate(drafter.model, head, vocab, ev)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", default="smollm2-135m-distilled")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k", default="2,3", help="comma-separated draft lengths, each run side by side")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--corpus-tokens", type=int, default=1024)
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--out", default=None, help="also write the Markdown report here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = [f"Command: `OMP_NUM_THREADS={args.threads} python {' '.join(sys.argv)}`", ""]

    def emit(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    target = load_target("smollm2-135m", device="cpu")
    ks = [int(k) for k in str(args.k).split(",")]
    drafter = DraftModelDrafter(args.draft)
    specs = {k: SpeculativeDecoder(target, drafter, k) for k in ks}
    ar = SpeculativeDecoder(target, None)
    assistant = load_draft_hf_model(args.draft, target)
    n = args.max_new_tokens
    emit(f"Draft `{args.draft}`: {drafter.model.config.num_hidden_layers} layers, "
         f"pruned head {drafter.vocab.size if drafter.vocab else 'off'}/{target.vocab_size}; K in {ks}, "
         f"max_new_tokens={n}, greedy, torch threads={args.threads}, CPU shared with other jobs.")
    emit()
    emit("| category | prompt | K | new tokens | acceptance | tokens/round | AR s | spec s | HF assisted s | spec vs AR | spec vs HF | identical |")
    emit("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for cat, texts in PROMPTS.items():
        for text in texts:
            prompt = chat_ids(target, text)
            ar_out, t_ar = timed(lambda: ar.generate(prompt, n))
            ref = ar_out.token_ids[0].tolist()
            hf_out, t_hf = timed(lambda: hf_assisted(target, assistant, prompt, n))
            for k, spec in specs.items():
                sp_out, t_sp = timed(lambda: spec.generate(prompt, n))
                same = ref == sp_out.token_ids[0].tolist() == hf_out
                st = sp_out.stats
                rows.append((cat, st.accepted, st.drafted, t_ar, t_sp, t_hf, same, st, k))
                emit(f"| {cat} | {text[:40]}... | {k} | {st.new_tokens} | {st.acceptance_rate:.2f} | "
                     f"{st.mean_accepted_length:.2f} | {t_ar:.2f} | {t_sp:.2f} | {t_hf:.2f} | "
                     f"{t_ar / t_sp:.2f}x | {t_hf / t_sp:.2f}x | {same} |")
    emit()
    for k in ks:
        kr = [r for r in rows if r[8] == k]
        acc = sum(r[1] for r in kr) / max(1, sum(r[2] for r in kr))
        emit(f"- K={k}: greedy acceptance (accepted / drafted, all chat+QA prompts) **{acc:.3f}** ("
             + ", ".join(f"{cat} {sum(r[1] for r in kr if r[0] == cat) / max(1, sum(r[2] for r in kr if r[0] == cat)):.3f}" for cat in PROMPTS)
             + f"); median speedup vs AR (same SpeculativeDecoder, K=0) **{statistics.median(r[3] / r[4] for r in kr):.2f}x**; "
             f"median speedup vs HF assisted generation (same draft as assistant_model) **{statistics.median(r[5] / r[4] for r in kr):.2f}x**")
    emit(f"- identical greedy output (AR == speculative == HF assisted) on all prompts: **{all(r[6] for r in rows)}**")
    emit(f"- HF assisted vs AR (median): {statistics.median(r[3] / r[5] for r in rows):.2f}x")
    draft_s = sum(r[7].draft_s for r in rows) / max(1, sum(r[7].drafted for r in rows))
    verify: dict[int, list[float]] = {}
    for r in rows:
        for k, (s, c) in r[7].verify_s_by_k.items():
            verify.setdefault(k, [0.0, 0])
            verify[k][0] += s
            verify[k][1] += c
    emit(f"- in-loop draft cost {1000 * draft_s:.1f} ms per drafted token; target forward by K: "
         + ", ".join(f"K={k}: {1000 * s / c:.0f} ms" for k, (s, c) in sorted(verify.items())))

    prompt = chat_ids(target, PROMPTS["qa"][0])
    pruned = propose_cost(target, drafter, prompt, max(ks), 10)
    full = DraftModelDrafter(args.draft, pruned_vocab=None)
    full.bind(target)
    emit(f"- propose cost per token: pruned head {1000 * pruned:.2f} ms vs full head {1000 * propose_cost(target, full, prompt, max(ks), 10):.2f} ms")
    emit()
    emit("Held-out (teacher-forced) agreement of the draft with the target:")
    emit()
    emit("| held-out set | positions | greedy agreement | expected acceptance sum min(p,q) at T=1 |")
    emit("|---|---|---|---|")
    for name, m in heldout_expected_acceptance(target, drafter, args.corpus_tokens, args.answers).items():
        emit(f"| {name} | {m['positions']} | {m['greedy_agreement']:.3f} | {m['expected_acceptance']:.3f} |")
    if args.out:
        Path(args.out).write_text("# Draft model benchmark\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
