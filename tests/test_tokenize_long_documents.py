"""Issue 30, section 6: a document longer than a tokenizing piece (64K characters; 3000 here)
is cut only where the ids do not change, so its ids are `tokenizer(text)`'s: a SentencePiece
tokenizer (Metaspace, prepend_scheme 'first') would otherwise put its word-start mark at every
piece that begins a line; one without a pre-tokenizer allows no exact cut, and is cut where
encodings with different contexts agree, each side encoded with the other's context (issue 43
item 3: never tokenized whole)."""
import pytest

from horizon_exec.data import data, pieces
from horizon_exec.data.data import Document, TextFile, tokenize_documents
from horizon_exec.data.tokenize import HFTokenizer
from tests.hf_tokenizers import bpe

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


def _text(n_chars: int) -> str:
    lines, i = [], 0
    while sum(map(len, lines)) < n_chars:
        lines.append(" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 9)) + "\n")
        i += 1
    return "".join(lines)


def _sentencepiece(tmp_path, split: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if split:   # Mistral / Llama-2 tokenizer.json of recent transformers
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    else:       # older Llama tokenizer.json: normalizer only, BPE over the whole text
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([_text(4000)], trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    return HFTokenizer(tmp_path / "tokenizer.json", eos_token="</s>")


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(pieces, "PIECE_CHARS", 3000)
    monkeypatch.setattr(pieces, "CUT_WINDOW", 200)


@pytest.mark.parametrize("kind", ["metaspace", "no-pretokenizer", "byte-level"])
def test_long_document_ids_equal_the_whole_texts(tmp_path, small_pieces, kind):
    if kind == "byte-level":
        tok_json = tmp_path / "tokenizer.json"
        bpe().save(str(tok_json))
        tok = HFTokenizer(tok_json)
    else:
        tok = _sentencepiece(tmp_path, split=kind == "metaspace")
    text = _text(20000)
    want = tok.tok.encode(text, add_special_tokens=False).ids + [tok.eos_id]
    assert tokenize_documents([Document(text)], tok).ids.tolist() == want
    (tmp_path / "doc.txt").write_text(text)
    assert tokenize_documents([TextFile(tmp_path / "doc.txt")], tok).ids.tolist() == want
    cut = data.text_pieces(text, tok)
    assert "".join(map(pieces.own_text, cut)) == text
    assert len(cut) > 3                         # tokenized in pieces, whatever the tokenizer
    assert all(len(pieces.own_text(p)) <= 3000 for p in cut)
