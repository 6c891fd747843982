"""Suffix decoding: model-free drafting from the current request and from every earlier one.

Each round the drafter looks up the longest suffix of the committed tokens (up to `max_match`
tokens) in two indexes (`drafters.suffix_index`): the current request's prompt + output, and a
global store of earlier requests' outputs bounded by `store_tokens`; and in a read-only corpus of
the target's earlier answers (`drafters.suffix_corpus`, `corpus`). The continuations that followed
the matched occurrences are merged into a counted tree; the speculation is its most probable nodes
(a node's probability = the share of occurrences that continue through it x the source's trust to
the power of its depth, >= `min_prob`), at most `spec_factor * match length + spec_offset` deep (a
long match earns a long draft), from whichever index promises more accepted tokens. Shares alone are
overconfident (one earlier occurrence promises every token of its copy), and how well a source
guesses differs per request (an extraction copies its own prompt, not the corpus's answers), so each
request keeps a trust per source (`SourceTrust`): it starts at `trust_prior` and follows the tokens
the target kept over those that source's drafts promised in this request. The number of nodes is
the one that maximises expected tokens per unit of verify time on the target's measured
verify-cost curve, so a hopeless guess is not verified at all. The default proposes the most
probable chain through that tree; `tree=true` proposes the tree itself (one forward with a tree
mask; on the CPU target a tree round costs more than the chain curve says, so the chain is the
default: benchmarks/RESULTS.md, "Suffix decoding").

Batched (`generate_batch`): every row has its own local index (its own prompt + output); the store
is shared. Each row drafts its most frequent chain, sized by the same rule, and shorter rows are
padded (`Draft.lengths`). Trees are batch-1 only (see `SuffixDrafter`).

The store learns from finished generations (`learn`, called by the decoder after each `generate`,
by the bench once per prompt) and can be saved to and loaded from a file (`save_store`,
`store_path`), so a deployment warms it from earlier traffic. Candidates are deterministic
(one-hot q): chains and trees are verified losslessly at any temperature (`specdraft.verify`,
`specdraft.tree`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from drafters.ngram import new_row_tokens
from drafters.suffix_corpus import CorpusIndex, find_corpus, load_corpus
from drafters.suffix_index import Candidate, SuffixIndex, best_chain, continuation_tree
from specdraft import costs
from specdraft.protocol import Draft, DraftContext

if TYPE_CHECKING:
    from specdraft.target import TargetModel

MAX_NODES = 32  # the most candidates one round verifies (the verify curve is read this far)
STORE_FORMAT = "specdraft-suffix-store"
STORE_VERSION = 1


def expected_tokens(nodes: Sequence[Candidate]) -> float:
    """Expected emitted tokens of a round verifying `nodes`: 1 (the target's own token) plus
    every node's probability of lying on the accepted path."""
    return 1.0 + sum(n.prob for n in nodes)


@dataclass
class SourceTrust:
    """One request's trust in each source's guesses: the per-token discount of its copies,
    (kept + weight x prior) / (promised + weight) over the rounds it drafted in this request
    (promised = the drafted nodes' probabilities, as discounted when drafted; kept = the tokens the
    target accepted), at most 1. prior = None: no discount (occurrence shares only)."""

    prior: float | None
    weight: float
    promised: dict[str, float] = field(default_factory=dict)
    kept: dict[str, float] = field(default_factory=dict)

    def of(self, source: str) -> float:
        """The per-token discount of `source`'s guesses now."""
        if self.prior is None:
            return 1.0
        kept = self.kept.get(source, 0.0) + self.weight * self.prior
        return min(1.0, kept / (self.promised.get(source, 0.0) + self.weight))

    def observe(self, source: str, promised: float, kept: int) -> None:
        """A verified round drafted from `source`: its nodes promised `promised` tokens, the target kept `kept`."""
        self.promised[source] = self.promised.get(source, 0.0) + promised
        self.kept[source] = self.kept.get(source, 0.0) + kept


class SuffixDrafter:
    """Suffix-decoding drafter. `specdraft-generate drafter=suffix` (module docstring).

    tree: false = the most frequent chain, true = a tree of the most frequent continuations.
    anchor: the longest n-gram indexed; max_match: the longest suffix matched (found by extending
        an anchor-long match backwards); max_occurrences: how many of the most recent occurrences
        of the match are counted.
    spec_factor, spec_offset: a match of m tokens drafts at most spec_factor * m + spec_offset
        tokens deep.
    min_prob: the least probability a candidate needs to be drafted.
    store_tokens: the global store's budget in tokens (oldest requests evicted first; a few
        hundred bytes per token in CPython, `store_stats`); 0 = no store (only the current request is
        searched).
    store_min_match: the shortest match the store may draft from: earlier requests are only
        evidence when they share a long context (a short match there drafts other requests' words
        and, worse, teaches the K policy that drafting does not pay).
    store_path: a store file (`save_store`) to start from; None = start empty.
    corpus: the target's earlier answers as a read-only suffix array (`drafters.suffix_corpus`):
        "auto" = the shipped corpus written by the bound target (none for other targets), a
        directory from `specdraft-suffix-corpus` or a shipped name, None = no corpus.
    corpus_tokens: the corpus's budget in tokens (its newest answers are kept).
    corpus_min_match: the shortest match the corpus may draft from.
    corpus_prior: pseudo-occurrences added to a corpus match's count, so a context seen once or
        twice in millions of tokens promises a fraction of a token, not certainty.
    trust_prior, trust_weight: a source's per-token trust at the start of a request, and how many
        promised tokens that prior is worth (`SourceTrust`); trust_prior=None: no trust discount.

    Trees at batch size 1 only: the decoder verifies a tree with one tree mask for the whole batch
    (`specdraft.tree`), so at B > 1 every row drafts its best chain instead, even with tree=true.
    Every round's size is chosen on the target's batch-1 verify-cost curve (measured before the
    generation; measuring a batch curve mid-generation would clear the target's cache).
    """

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = MAX_NODES
    sizes_own_drafts: ClassVar[bool] = True  # every round's node count is chosen on the verify curve
    batched: ClassVar[bool] = True

    def __init__(
        self,
        tree: bool = False,
        anchor: int = 4,
        max_match: int = 32,
        max_occurrences: int = 32,
        spec_factor: float = 1.5,
        spec_offset: float = 2.0,
        min_prob: float = 0.1,
        store_tokens: int = 200_000,
        store_min_match: int = 4,
        store_path: str | None = None,
        corpus: str | None = "auto",
        corpus_tokens: int = 8_000_000,
        corpus_min_match: int = 1,
        corpus_prior: float = 2.0,
        trust_prior: float | None = 0.8,
        trust_weight: float = 16.0,
    ) -> None:
        problems = []
        for name, value, low in (("anchor", anchor, 1), ("max_match", max_match, 1),
                                 ("max_occurrences", max_occurrences, 1), ("store_tokens", store_tokens, 0),
                                 ("store_min_match", store_min_match, 1), ("corpus_tokens", corpus_tokens, 1),
                                 ("corpus_min_match", corpus_min_match, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                problems.append(f"{name} must be an integer >= {low}, got {value!r}")
        if not 0.0 <= min_prob <= 1.0:
            problems.append(f"min_prob must be in [0, 1], got {min_prob!r}")
        if isinstance(corpus_prior, bool) or not isinstance(corpus_prior, (int, float)) or corpus_prior < 0:
            problems.append(f"corpus_prior must be a number >= 0 (pseudo-occurrences), got {corpus_prior!r}")
        if trust_prior is not None and (isinstance(trust_prior, bool) or not isinstance(trust_prior, (int, float))
                                        or not 0.0 < trust_prior <= 1.0):
            problems.append(f"trust_prior must be in (0, 1] or null (no trust discount), got {trust_prior!r}")
        if isinstance(trust_weight, bool) or not isinstance(trust_weight, (int, float)) or trust_weight <= 0:
            problems.append(f"trust_weight must be a number > 0 (promised tokens the prior is worth), got {trust_weight!r}")
        if spec_factor < 0 or spec_offset < 0:
            problems.append(f"spec_factor and spec_offset must be >= 0, got {spec_factor!r}, {spec_offset!r}")
        if problems:
            raise ValueError("SuffixDrafter: " + "; ".join(problems) + ".")
        self.tree = bool(tree)
        self.anchor, self.max_match, self.max_occurrences = anchor, max_match, max_occurrences
        self.spec_factor, self.spec_offset, self.min_prob = float(spec_factor), float(spec_offset), float(min_prob)
        self.store_tokens, self.store_min_match = store_tokens, store_min_match
        self.corpus_spec, self.corpus_tokens, self.corpus_min_match = corpus, corpus_tokens, corpus_min_match
        self.corpus_prior = float(corpus_prior)
        self.trust_prior = None if trust_prior is None else float(trust_prior)
        self.trust_weight = float(trust_weight)
        self.corpus: CorpusIndex | None = None  # loaded at bind (`find_corpus`: which one depends on the target)
        self._corpus_dir: Path | None = None
        self.store: SuffixIndex | None = SuffixIndex(anchor, store_tokens) if store_tokens else None
        self._store_vocab: int | None = None
        if store_path is not None:
            self._load_store(store_path)
        self._curve: list[float] | None = None
        self._target: TargetModel | None = None
        self.locals: list[SuffixIndex] = []  # one local index per row of the current batch
        self.trusts: list[SourceTrust] = []  # one per row: its request's trust in each source
        self._pending: list[tuple[str, float] | None] = []  # per row: (source, promised tokens) until commit
        self.reset()

    # ------------------------------------------------------------------------------- protocol
    def bind(self, target: TargetModel) -> None:
        """Check a loaded store was written for this vocabulary, load the corpus made for this
        target (`find_corpus`); the curve is read on first use."""
        if self._store_vocab is not None and self._store_vocab != target.vocab_size:
            raise ValueError(
                f"the suffix store was written for a vocabulary of {self._store_vocab} tokens but the "
                f"target has {target.vocab_size}; build the store with this target's tokenizer."
            )
        found = find_corpus(self.corpus_spec, target)
        if found is None:
            self.corpus, self._corpus_dir = None, None
        elif found != self._corpus_dir:
            self.corpus, self._corpus_dir = load_corpus(found, self.corpus_tokens), found
        self._target, self._curve = target, None

    @property
    def local(self) -> SuffixIndex:
        """Row 0's local index (the request's, at batch size 1)."""
        return self.locals[0]

    def reset(self) -> None:
        """A new request (or batch): empty local indexes and fresh trust (the store keeps what it learned)."""
        self._new_rows(1)

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        self._catch_up(ctx)
        device = ctx.token_ids.device
        tree = self.tree and len(self.locals) == 1  # the decoder verifies trees at batch size 1 only
        rounds = [self._round(local, trust, min(num_tokens, MAX_NODES), tree)
                  for local, trust in zip(self.locals, self.trusts)]
        self._pending = [(source, sum(n.prob for n in nodes)) if nodes else None for nodes, source in rounds]
        if len(rounds) == 1:
            nodes = rounds[0][0]
            ids = torch.tensor([[n.token for n in nodes]], dtype=torch.long, device=device).reshape(1, len(nodes))  # [1, N]
            if not tree:
                return Draft(token_ids=ids)
            parents = torch.tensor([[n.parent for n in nodes]], dtype=torch.long, device=device).reshape(1, len(nodes))
            return Draft(token_ids=ids, parents=parents)  # [1, N] each
        chains = [[n.token for n in nodes] for nodes, _ in rounds]  # a chain per row
        counts = [len(c) for c in chains]
        k = max(counts)
        ids = torch.tensor([c + [0] * (k - len(c)) for c in chains], dtype=torch.long, device=device)
        lengths = None if min(counts) == k else torch.tensor(counts, dtype=torch.long, device=device)
        return Draft(token_ids=ids.reshape(len(chains), k), lengths=lengths)  # [B, K], [B]

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """Each row's trust learns what the target kept of the source it drafted from; then the
        committed tokens are indexed."""
        pending, self._pending = self._pending, []
        if len(pending) == len(self.trusts) == len(num_accepted):
            for trust, round_, kept in zip(self.trusts, pending, num_accepted):
                if round_ is not None:
                    trust.observe(round_[0], round_[1], int(kept))
        self._catch_up(ctx)

    def keep_rows(self, rows: Sequence[int]) -> None:
        self.locals = [self.locals[r] for r in rows]
        self.trusts = [self.trusts[r] for r in rows]
        self._pending = [self._pending[r] for r in rows] if self._pending else []

    def learn(self, token_ids: Tensor, prompt_len: int) -> dict[str, Any]:
        """Remember a finished generation's output (token_ids [T] = prompt + output) in the store;
        returns the store's and the corpus's size (`store_stats`), {} with neither."""
        if self.store is None:
            return self.store_stats() if self.corpus is not None else {}
        if token_ids.shape[0] > prompt_len:
            self.store.add(token_ids[prompt_len:].tolist())
        return self.store_stats()

    # ------------------------------------------------------------------------------- drafting
    def speculate(self, context: Sequence[int], max_nodes: int, local: SuffixIndex | None = None,
                  tree: bool | None = None) -> list[Candidate]:
        """The best candidates (best first, parents first) continuing `context`, from the local
        index (`local`, default row 0's), the store or the corpus, whichever promises the most
        accepted tokens under row 0's trust; a chain unless `tree` (default: the drafter's tree option)."""
        local = self.locals[0] if local is None else local
        return self._speculate(context, max_nodes, local, self.trusts[0], self.tree if tree is None else tree)[0]

    def _round(self, local: SuffixIndex, trust: SourceTrust, max_nodes: int, tree: bool) -> tuple[list[Candidate], str]:
        """A row's speculation (its local index holds its committed tokens), cut to the nodes worth
        verifying on the target's verify-cost curve, and the source it came from."""
        nodes, source = self._speculate(local.sequences[0], max_nodes, local, trust, tree)
        return nodes[: costs.nodes_worth_verifying([n.prob for n in nodes], self._verify_curve())], source

    def _speculate(self, context: Sequence[int], max_nodes: int, local: SuffixIndex, trust: SourceTrust,
                   tree: bool) -> tuple[list[Candidate], str]:
        """`speculate` with the winning source's name ("" when nothing matched)."""
        best: list[Candidate] = []
        best_source = ""
        sources = (("request", local, 1, 0.0), ("store", self.store, self.store_min_match, 0.0),
                   ("corpus", self.corpus, self.corpus_min_match, self.corpus_prior))  # (name, index, shortest match, prior)
        for name, index, min_match, prior in sources:
            if index is None:
                continue
            match = index.match(context, self.max_match, self.max_occurrences)
            if match is None or match.length < min_match:
                continue
            depth = min(int(self.spec_factor * match.length + self.spec_offset), max_nodes)
            windows = index.continuations(match, depth)
            nodes = (continuation_tree(windows, max_nodes, self.min_prob, prior, trust.of(name)) if tree
                     else best_chain(windows, self.min_prob, prior, trust.of(name)))
            if expected_tokens(nodes) > expected_tokens(best):
                best, best_source = nodes, name
        return best, best_source

    def _new_rows(self, batch_size: int) -> None:
        """Empty local indexes and fresh trust for a new batch of requests."""
        self.locals = [self._new_local() for _ in range(batch_size)]
        self.trusts = [SourceTrust(self.trust_prior, self.trust_weight) for _ in range(batch_size)]
        self._pending = []

    def _new_local(self) -> SuffixIndex:
        """An empty local index whose one growing sequence (id 0) is a row's prompt + output."""
        local = SuffixIndex(self.anchor)
        local.start()
        return local

    def _catch_up(self, ctx: DraftContext) -> None:
        """Index every row's committed tokens not yet in its local index (they only grow per
        request; another batch size than the indexes have, without `keep_rows`, is a new batch)."""
        b = ctx.batch_size
        if len(self.locals) != b:
            self._new_rows(b)
        have = [len(local.sequences[0]) for local in self.locals]
        if any(n < h for n, h in zip(ctx.row_lengths(), have)):
            raise ValueError("the committed tokens shrank within a request; call reset() for a new prompt.")
        if b == 1:
            if ctx.token_ids.shape[1] > have[0]:
                self.locals[0].extend(0, ctx.token_ids[0, have[0] :].tolist())
            return
        for local, new in zip(self.locals, new_row_tokens(ctx, have)):
            if new:
                local.extend(0, new)

    def _verify_curve(self) -> list[float]:
        """T_v(n) / T_v(0) for n = 0..MAX_NODES on the bound target (measured once per process and
        model, before a generation's clock starts: `verify_curve_tokens`)."""
        if self._curve is None:
            if self._target is None:
                raise ValueError("SuffixDrafter needs bind(target) before propose: it sizes drafts on the target's verify cost.")
            self._curve = costs.verify_curve(self._target, MAX_NODES)
        return self._curve

    # ------------------------------------------------------------------------------- store files
    def store_stats(self) -> dict[str, Any]:
        """The store's size against its budget (tokens, requests, estimated bytes) and the
        corpus's (tokens, budget, bytes of its arrays)."""
        store, corpus = self.store, self.corpus
        return {"budget_tokens": self.store_tokens,
                "tokens": 0 if store is None else store.num_tokens,
                "requests": 0 if store is None else len(store.sequences),
                "bytes": 0 if store is None else store.memory_bytes(),
                "corpus_budget_tokens": self.corpus_tokens,
                "corpus_tokens": 0 if corpus is None else corpus.num_tokens,
                "corpus_bytes": 0 if corpus is None else corpus.memory_bytes()}

    def save_store(self, path: str | Path) -> None:
        """Write the store (its requests' tokens, oldest first) to a JSON file, atomically."""
        if self.store is None:
            raise ValueError("this SuffixDrafter has no store (store_tokens=0); nothing to save.")
        if self._target is None and self._store_vocab is None:
            raise ValueError("bind(target) before save_store: the file records the target's vocabulary size.")
        vocab = self._target.vocab_size if self._target is not None else self._store_vocab
        record = {"format": STORE_FORMAT, "version": STORE_VERSION, "vocab_size": vocab,
                  "sequences": list(self.store.sequences.values())}
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def _load_store(self, path: str | Path) -> None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ValueError(f"store_path={path}: no such file; give a file written by SuffixDrafter.save_store, or null.")
        if self.store is None:
            raise ValueError("store_path is set but store_tokens=0 (no store); set store_tokens > 0 to load it.")
        try:
            record = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"store_path={path}: not a readable JSON store ({err}).") from err
        if (not isinstance(record, dict) or record.get("format") != STORE_FORMAT or record.get("version") != STORE_VERSION
                or not isinstance(record.get("sequences"), list) or not isinstance(record.get("vocab_size"), int)):
            raise ValueError(f"store_path={path}: not a {STORE_FORMAT} file of version {STORE_VERSION} "
                             "(with `sequences` and `vocab_size`); write it with SuffixDrafter.save_store.")
        for seq in record["sequences"]:
            self.store.add([int(t) for t in seq])
        self._store_vocab = int(record["vocab_size"])
