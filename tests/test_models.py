"""Model resolution and loading errors (no weights needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from specdraft import models
from specdraft.formats.target_info import tokenizer_hash
from specdraft.models import load_target, load_tokenizer, resolve_source, tiny_random_llama
from specdraft.target import TargetModel


def test_unknown_alias_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        resolve_source("no-such-model")


def test_missing_gguf_file(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="does not exist"):
        resolve_source(str(tmp_path / "x.gguf"))


def test_directory_without_config(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="config.json"):
        resolve_source(str(tmp_path))


def test_local_directory_roundtrip(tmp_path) -> None:  # noqa: ANN001
    model = tiny_random_llama(vocab_size=16, seed=3)
    model.save_pretrained(tmp_path)
    target = load_target(str(tmp_path), device="cpu", with_tokenizer=False)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(target.model(ids).logits, model(ids).logits)


def test_offline_hub_id_fails_fast_with_a_sentence() -> None:
    code = (
        "from specdraft.models import load_target\n"
        "try:\n    load_target('nobody-xyz/not-a-model', device='cpu')\n"
        "except ValueError as e:\n    print('ERR', e)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "ERR" in out.stdout and "HF_HUB_OFFLINE" in out.stdout, out.stderr[-2000:]


def test_target_cache_crop(tiny_target: TargetModel) -> None:
    tiny_target.reset()
    tiny_target.forward(torch.tensor([[1, 2, 3, 4]]))
    assert tiny_target.cache_length == 4
    tiny_target.crop(2)
    assert tiny_target.cache_length == 2
    with pytest.raises(ValueError, match="crop"):
        tiny_target.crop(5)
    # after a crop the cache gives the same logits as a fresh forward over the kept prefix
    got = tiny_target.forward(torch.tensor([[7, 8]])).logits
    want = tiny_target.model(torch.tensor([[1, 2, 7, 8]])).logits[:, -2:]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_tokenizer_is_read_once_and_every_caller_gets_its_own_copy(tmp_path: Path) -> None:
    """load_tokenizer memoises the parsed tokenizer (a GGUF's takes seconds) but hands out copies,
    and reads a folder again once its files change."""
    words = ["<unk>", "a", "b", "c"]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(tmp_path)
    tiny_random_llama(vocab_size=16).config.save_pretrained(tmp_path)  # a model folder: config.json too
    first = load_tokenizer(str(tmp_path))
    first.add_tokens(["zzz"])
    second = load_tokenizer(str(tmp_path))
    assert first is not second and len(second) == 4 and second("a b c").input_ids == [1, 2, 3]
    later = os.stat(tmp_path / "tokenizer.json").st_mtime + 10
    first.save_pretrained(tmp_path)  # the folder now holds the tokenizer with "zzz"
    os.utime(tmp_path / "tokenizer.json", (later, later))
    assert len(load_tokenizer(str(tmp_path))) == 5


def test_a_gguf_tokenizer_is_parsed_once_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer of a GGUF is saved under the cache folder and read from there by the next
    process (here: after the in-process memo is cleared), identical in what it encodes."""
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    models._read_tokenizer.cache_clear()
    parsed = load_tokenizer("smollm2-135m")
    saved = list((tmp_path / "tokenizers").glob("*/tokenizer.json"))
    assert len(saved) == 1
    models._read_tokenizer.cache_clear()

    def no_parsing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the GGUF was parsed again")

    monkeypatch.setattr(models, "_from_pretrained", no_parsing)
    reread = load_tokenizer("smollm2-135m")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, café 日本 ünï"}]
    text = parsed.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == reread.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert parsed(text).input_ids == reread(text).input_ids and len(parsed) == len(reread)
    assert tokenizer_hash(parsed) == tokenizer_hash(reread)
    assert [p.name for p in (tmp_path / "tokenizers").iterdir()] == [saved[0].parent.name]  # no temporary left
