"""Copy chats: the target's own answers asked for again, so a draft learns to copy from its context.

A small draft trained on the target's answers learns the answers' typical content, not how to look
back: on a chat that repeats or edits an earlier assistant turn (a list shown again with an item
added, an email made formal, the target's own loops) it predicts list items it memorised instead of
the ones in the context (RESULTS §3m). Copying needs an induction mechanism (find the earlier
occurrence, copy what followed) that the target has and the draft did not learn; these sequences
give it something to learn from: the conversation of a self-generated record, the target's answer,
one more user turn that asks for that answer again (`REQUESTS`), and the same answer once more. The
teacher's top-k is taken on the repeated answer only (on 4 records checked by hand the target's
greedy choice was the copied token at 98-100% of the positions), so the distillation target is
still the target's own distribution, on inputs that reward copying.

Measured (RESULTS §3m): a 2-layer draft trained 40 minutes with 800 of them did not learn to copy
(on held-out copy chats it agrees with the target no more often than on the answers themselves).

No request is a built-in suite user text (tested); the answers come from the train split.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from torch import Tensor, tensor

REQUESTS = (
    "Can you show me that again?",
    "Please repeat your answer.",
    "Say that again, please.",
    "Could you write that once more?",
    "Repeat the last answer word for word.",
    "I missed that. Can you repeat it?",
    "Please write the same answer again.",
    "One more time, please.",
    "Show me your previous answer again.",
    "Can you paste that again so I can copy it?",
)


_MARK = "\u2063ANSWER\u2063"  # stands for the earlier answer when the chat template is rendered


def request_turn(tokenizer: object, request: str) -> list[int]:
    """Token ids between an assistant answer and the next assistant answer, in the tokenizer's own
    chat template: end of the assistant turn, the user turn with `request`, the assistant header."""
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}, {"role": "user", "content": request}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    if text.count(_MARK) != 1:
        raise ValueError("copy chats need a tokenizer whose chat template renders an assistant turn verbatim; "
                         "this one does not (set data.copy_chats=0).")
    return tokenizer(text.split(_MARK)[1], add_special_tokens=False)["input_ids"]  # type: ignore[operator]


def copy_chat_sequences(
    records: Sequence[dict], tokenizer: object, eos_token_ids: Sequence[int], count: int, max_len: int, seed: int = 0,
) -> tuple[list[Tensor], list[int]]:
    """Up to `count` copy chats from self-generated records, drawn at random with `seed`, skipping
    any longer than max_len tokens in all.

    Returns (sequences [T] int64, starts): sequence = the record's prompt + its answer (end of turn
    dropped) + `request_turn` + the answer again; start = the position whose next token is the
    first token of the repeated answer (the teacher's top-k is needed from there on).
    """
    if count < 0:
        raise ValueError(f"data.copy_chats must be >= 0 (0 = none), got {count}.")
    rng = random.Random(seed)
    order = list(range(len(records)))
    rng.shuffle(order)
    turns = {req: request_turn(tokenizer, req) for req in REQUESTS}
    seqs: list[Tensor] = []
    starts: list[int] = []
    for i in order:
        if len(seqs) >= count:
            break
        r = records[i]
        answer = list(r["completion_ids"])
        said = answer[:-1] if answer and answer[-1] in eos_token_ids else answer  # the turn adds its own end
        ids = list(r["prompt_ids"]) + said + turns[rng.choice(REQUESTS)] + answer
        if not said or len(ids) > max_len:
            continue
        seqs.append(tensor(ids))
        starts.append(len(ids) - len(answer) - 1)
    return seqs, starts
