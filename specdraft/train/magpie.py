"""Magpie-style prompts: the target writes the user's turn itself.

An instruction-tuned model has seen countless conversations; fed its chat template up to the point
where a user's message begins, it samples a plausible user message (Xu et al., "Magpie", 2024).
That gives any user, for any target, offline, a broad set of requests in the target's own
distribution, with no dataset and no hub. Continued after the target's own answer, it gives the
next user turn of a multi-turn chat.

The template is rendered with a sentinel as the user's text and cut at the sentinel, so this works
for any chat template that places the user's text verbatim (an error says so otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SENTINEL = "\u2063MAGPIE\u2063"  # invisible separators around a word no template produces itself

# Varied system prompts (None = the template's own default): the same model writes different users
# for a coding assistant, a tutor or a travel agent.
SYSTEM_PROMPTS: tuple[str | None, ...] = (
    None,
    None,
    None,
    "You are a helpful assistant.",
    "You are a friendly assistant who answers everyday questions clearly.",
    "You are an expert Python programmer who helps users write and fix code.",
    "You are a patient math tutor. Explain each step of the solution.",
    "You are a professional translator between English, French, German, Spanish and Italian.",
    "You are a writing assistant who helps users draft emails, stories and essays.",
    "You are a knowledgeable science teacher.",
    "You are a travel agent who plans trips and gives practical travel advice.",
    "You are a careful editor who summarises long documents faithfully.",
    "You are a history enthusiast who explains historical events in plain words.",
    "You are a customer support agent for an online shop.",
    "You are a fitness and nutrition coach.",
    "You are a career advisor who helps with CVs, interviews and job searches.",
    "You are a data analyst who explains statistics and writes SQL queries.",
    "You are a creative game master who runs interactive role-play stories.",
    "You are an assistant that answers questions using the documents the user provides.",
    "You are a concise assistant. Keep answers short.",
    "You are a software engineer who explains how systems and algorithms work.",
    "You are a personal finance advisor who explains budgeting and saving.",
)


def user_turn_prefix(tokenizer: Any, messages: Sequence[dict[str, str]] = ()) -> list[int]:
    """Token ids of the chat template rendered up to where the next user message's text begins.

    messages: the conversation so far (an optional system message, then alternating turns ending
    with an assistant turn, or empty)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("Magpie prompts need a chat model: the tokenizer has no chat template; "
                         "use an instruction-tuned target or sources without `magpie`.")
    text = tokenizer.apply_chat_template([*messages, {"role": "user", "content": SENTINEL}], tokenize=False)
    if text.count(SENTINEL) != 1:
        raise ValueError("the chat template does not place the user's text verbatim, so the start of a "
                         "user turn cannot be found; use sources without `magpie` for this target.")
    return list(tokenizer.encode(text[: text.index(SENTINEL)], add_special_tokens=False))


def system_messages(system: str | None) -> list[dict[str, str]]:
    """The leading system message for `system` (none for the template's default)."""
    return [] if system is None else [{"role": "system", "content": system}]
