"""Issue 30: a WordLevel tokenizer.json whose unk token is not in its vocabulary fails inside
`tokenizers` on any word outside the vocabulary, and on the probe text the specials are found
with even when every word of the data is in it. Refused up front naming the file (exit 2)."""

import pytest

from horizon_sim.errors import HorizonError


def _wordlevel(folder, vocab, unk="<unk>"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    t = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir()
    t.save(str(folder / "tokenizer.json"))
    return folder


def test_wordlevel_without_unk_is_refused_naming_the_file(tmp_path):
    from horizon_exec.data.tokenize import HFTokenizer
    d = _wordlevel(tmp_path / "tok", {"hello": 0, "world": 1, "<eos>": 2})
    with pytest.raises(HorizonError) as e:
        HFTokenizer(d)
    msg = str(e.value)
    assert msg.startswith(str(d / "tokenizer.json")) and "'<unk>'" in msg and "\n" not in msg, msg


def test_wordlevel_with_unk_reads_and_encodes(tmp_path):
    from horizon_exec.data.tokenize import HFTokenizer
    d = _wordlevel(tmp_path / "tok", {"hello": 0, "world": 1, "<eos>": 2, "<unk>": 3})
    t = HFTokenizer(d, eos_token="<eos>")
    assert t.encode(["hello world zzz"]) == [[0, 1, 3]]


def test_encode_failure_is_one_line_naming_the_file(tmp_path):
    from horizon_exec.data.tokenize import HFTokenizer
    d = _wordlevel(tmp_path / "tok", {"hello": 0, "<unk>": 1})
    t = HFTokenizer(d)
    with pytest.raises(HorizonError, match=rf"^{d / 'tokenizer.json'}: cannot encode the data"):
        t.encode(["bad \ud800"])
