"""Issue 43 item 3: a document the tokenizer cannot cut at a space (a DNA-like sequence, a run
of letters) is still tokenized in bounded pieces, and the admission counts what tokenizing
holds.

The `tokenizers` library holds ~210 bytes per UTF-8 byte it encodes at once
(data.TOKENIZE_BYTES_PER_TEXT_BYTE says how it was measured); a 20 MB single-line record used
to be encoded whole (3.9 GiB) and a 50 MB one aborted in a Rust allocation failure. Now
pieces.py cuts every text into pieces of at most PIECE_CHARS characters (plus context), at a
token boundary where encodings with different contexts agree, so the ids are the whole
text's; the pieces always cover the text exactly once (their ids decode to it).
"""
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from horizon_exec.data import data
from horizon_exec.data.data import Document, TextFile, data_bytes_bound, tokenize_documents
from horizon_exec.data.tokenize import HFTokenizer
from tests.hf_tokenizers import bpe

ROOT = Path(__file__).resolve().parents[1]
MEASURED_BYTES_PER_TEXT_BYTE = 212   # the highest figure data.TOKENIZE_BYTES_PER_TEXT_BYTE's comment gives


def _dna(n: int, seed: int = 0) -> str:
    """n random letters of ACGT (each byte of a seeded random stream, mod 4)."""
    return random.Random(seed).randbytes(n).translate(bytes(b"ACGT"[i % 4] for i in range(256))).decode()


def _saved(tok, tmp_path) -> HFTokenizer:
    tok.save(str(tmp_path / "tokenizer.json"))
    return HFTokenizer(tmp_path / "tokenizer.json")


def _dna_bpe(tmp_path, max_token_length=16) -> HFTokenizer:
    """A byte-level BPE whose merges run across a whole DNA sequence (one pre-token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([_dna(20000, seed=1), "a" * 3000], trainers.BpeTrainer(
        vocab_size=400, max_token_length=max_token_length, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _saved(tok, tmp_path)


@pytest.fixture
def small_pieces(monkeypatch):
    from horizon_exec.data import pieces
    monkeypatch.setattr(pieces, "PIECE_CHARS", 3000)
    monkeypatch.setattr(pieces, "CUT_WINDOW", 200)


def _encode_calls(tok, monkeypatch) -> list[int]:
    """UTF-8 bytes handed to the tokenizer by each encode call (context included)."""
    seen, real = [], tok.encode

    def spy(texts):
        seen.append(sum(len(getattr(t, "text", t).encode("utf-8")) for t in texts))
        return real(texts)
    monkeypatch.setattr(tok, "encode", spy)
    return seen


def test_a_dna_record_is_tokenized_in_bounded_memory(tmp_path):
    """A 2 MB single-line record of 'ACGT' (one pre-token, one token a character with the
    tests' byte-level BPE) loads in its own process: the peak grows by less than what the
    admission counted for the data (data_bytes_bound), not by ~210 bytes a character
    (the whole record encoded at once: ~420 MB)."""
    folder = tmp_path / "tok"
    folder.mkdir()
    bpe().save(str(folder / "tokenizer.json"))
    f = tmp_path / "dna.jsonl"
    f.write_text(json.dumps({"text": _dna(2_000_000)}) + "\n")
    code = ("import sys, json\nfrom horizon_exec.procfs import vm_hwm_bytes\n"
            "from horizon_exec.data.data import load_dataset, data_bytes_bound\n"
            "from horizon_exec.data.tokenize import HFTokenizer\n"
            "tok = HFTokenizer(sys.argv[2])\nbound = data_bytes_bound(sys.argv[1], tok, 256)\n"
            "before = vm_hwm_bytes()\nds = load_dataset(sys.argv[1], tok, 256)\n"
            "print(json.dumps([before, vm_hwm_bytes(), ds.n_tokens, bound]))")
    out = subprocess.run([sys.executable, "-c", code, str(f), str(folder)], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={"RAYON_NUM_THREADS": "2", "PATH": ""})
    before, after, n, bound = json.loads(out.stdout)
    assert n > 2_000_000
    assert after - before <= bound, (after - before, bound)
    assert after - before < 300 * 2**20, after - before


def test_the_admission_counts_every_tokenizing_call(tmp_path, monkeypatch):
    """Whatever the documents (a 700 KB run without a space, prose, a text file), no encode
    call is handed more text than data.TOKENIZE_BATCH_BYTES (counted in data_bytes_bound)
    allows at the measured ~212 bytes per UTF-8 byte."""
    tok = _saved(bpe(), tmp_path)
    seen = _encode_calls(tok, monkeypatch)
    prose = data.BUILTIN_CORPUS.read_text()[:200_000]
    (tmp_path / "dna.txt").write_text(_dna(200_000, seed=2))
    tokenize_documents([Document(_dna(700_000)), Document(prose), TextFile(tmp_path / "dna.txt")], tok)
    assert seen and max(seen) * MEASURED_BYTES_PER_TEXT_BYTE <= data.TOKENIZE_BATCH_BYTES, max(seen)
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "x"}) + "\n")
    assert data_bytes_bound(f, tok, 64) >= data.TOKENIZE_BATCH_BYTES


def test_the_admission_counts_the_record_being_read(tmp_path):
    """The record being tokenized is held whole (its line and its text: two strings): the
    same 2 MB as one record is counted at least 2 MB more than as two of 1 MB."""
    tok = _saved(bpe(), tmp_path)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    one.write_text(json.dumps({"text": _dna(2_000_000)}) + "\n")
    two.write_text("".join(json.dumps({"text": _dna(1_000_000, seed=s)}) + "\n" for s in (1, 2)))
    assert data_bytes_bound(one, tok, 64) - data_bytes_bound(two, tok, 64) >= 2 * 1_000_000


def test_spaced_text_gives_the_whole_texts_ids(tmp_path):
    """Prose longer than several pieces (default sizes): the ids are tokenizing it whole."""
    tok = _saved(bpe(), tmp_path)
    text = data.BUILTIN_CORPUS.read_text()
    from horizon_exec.data.pieces import PIECE_CHARS, text_pieces
    assert len(text_pieces(text, tok)) >= len(text) // PIECE_CHARS
    want = tok.tok.encode(text, add_special_tokens=False).ids + [tok.eos_id]
    assert tokenize_documents([Document(text)], tok).ids.tolist() == want


@pytest.mark.parametrize("kind", ["dna", "run of a", "dna, run, dna"])
def test_an_uncuttable_text_is_cut_in_bounded_pieces(tmp_path, small_pieces, kind):
    """No space anywhere: each piece's own text is bounded; the pieces are stitched at token
    boundaries where the contexts agree, so the ids equal tokenizing the text whole (a DNA
    sequence, a run from the text's start). A run that starts mid-text pairs its merges from
    its own start, which no window sees: there only the tokens at a cut may differ (a few),
    and the ids still decode to the text. A text file gives the same ids."""
    import difflib
    from horizon_exec.data import pieces
    tok = _dna_bpe(tmp_path)
    text = {"dna": _dna(20000, seed=3), "run of a": "a" * 20000,
            "dna, run, dna": _dna(7000, seed=4) + "a" * 6000 + _dna(7000, seed=5)}[kind]
    cut = pieces.text_pieces(text, tok)
    assert len(cut) >= 7 and all(len(pieces.own_text(p)) <= 3000 for p in cut)
    assert "".join(map(pieces.own_text, cut)) == text
    want = tok.tok.encode(text, add_special_tokens=False).ids
    got = tokenize_documents([Document(text)], tok).ids.tolist()
    assert got[-1] == tok.eos_id and tok.tok.decode(got[:-1]) == text
    if kind != "dna, run, dna":
        assert got[:-1] == want
    ops = difflib.SequenceMatcher(None, want, got[:-1], autojunk=False).get_opcodes()
    differing = sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in ops if op != "equal")
    assert differing <= 4 * (len(cut) - 1), ops
    (tmp_path / "doc.txt").write_text(text)
    assert tokenize_documents([TextFile(tmp_path / "doc.txt")], tok).ids.tolist() == got


def test_a_forced_cut_stays_lossless(tmp_path, small_pieces):
    """Tokens longer than the window (a vocabulary with a 500-letter token): no cut where the
    contexts agree, so the pieces are cut at their end; ids near a cut may then differ from
    tokenizing whole, but they still decode to the text exactly."""
    from horizon_exec.data import pieces
    tok = _dna_bpe(tmp_path, max_token_length=None)
    text = "a" * 20000 + _dna(5000, seed=6)
    cut = pieces.text_pieces(text, tok)
    assert len(cut) >= 8 and all(len(pieces.own_text(p)) <= 3000 for p in cut)
    ids = tokenize_documents([Document(text)], tok).ids.tolist()
    assert ids[-1] == tok.eos_id and tok.tok.decode(ids[:-1]) == text


def test_the_admission_counts_a_chat_record_tokenized_whole(tmp_path):
    """A chat record is rendered and tokenized whole (its assistant mask needs the whole
    conversation's offsets), so the longest line that may be one is counted at the tokenizer's
    measured bytes per byte; a text record of the same length is not (it is cut in pieces)."""
    tok = _saved(bpe(), tmp_path)
    chat, text = tmp_path / "chat.jsonl", tmp_path / "text.jsonl"
    body = _dna(1_000_000)
    chat.write_text(json.dumps({"text": "hi"}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": body}]}) + "\n")
    text.write_text(json.dumps({"text": "hi"}) + "\n" + json.dumps({"text": body + " " * 35}) + "\n")
    assert chat.stat().st_size == text.stat().st_size
    more = data_bytes_bound(chat, tok, 64) - data_bytes_bound(text, tok, 64)
    assert more >= data.TOKENIZE_BYTES_PER_TEXT_BYTE * 1_000_000


def test_the_chat_key_is_found_across_read_blocks(tmp_path, monkeypatch):
    """The scan reads blocks: a key split between two blocks, or a line longer than a block,
    still marks its line as a possible chat record, and only that line."""
    line = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]})
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "short"}\n' + line + "\n" + '{"text": "' + "y" * 9000 + '"}\n')
    real_open = open

    class SmallBlocks:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n):
            return self.fh.read(7)   # every key and line crosses blocks

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()
    monkeypatch.setattr(data, "open", lambda p, mode="r": SmallBlocks(real_open(p, mode)), raising=False)
    records, longest, chat = data._jsonl_lines(f)
    assert (records, longest, chat) == (3, 9000 + len('{"text": ""}'), len(line))
