"""Training data: JSONL (text, or instruction/response with the prompt masked), text files,
tokenizer.json through `tokenizers` or bytes, packing, the eval split, deterministic
shuffling by seed with a resumable position, and clear errors."""
import json

import pytest
import torch

from horizon_exec.data.data import (BUILTIN_CORPUS, PROMPT_FORMAT, Batches, Document, PackedData, TokenStream,
                               load_dataset, read_documents, split_indices, tokenize_documents)
from horizon_exec.data.tokenize import ByteTokenizer, HFTokenizer, load_tokenizer
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import executor_grads, hf_grads, rel_err, tiny_hf, tiny_spec


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ---- reading and masking ---------------------------------------------------------------------

def test_jsonl_text_and_instruction_records(tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", [{"text": "plain"}, {"instruction": "Add.", "response": "4"},
                                      {"instruction": "Sum", "input": "1 2", "response": "3", "id": 7}])
    docs = read_documents(f)
    assert [(d.prompt, d.text) for d in docs] == [
        (None, "plain"), ("Add.\n\n", "4"), ("Sum\n\n1 2\n\n", "3")]
    assert PROMPT_FORMAT.format(instruction="Add.") == "Add.\n\n"


def test_prompt_tokens_are_not_targets(tmp_path):
    """Bytes: 'Q\\n\\n' is the prompt, 'ab' + end-of-document (0) the response. Labels are
    the next token, -100 where that token belongs to a prompt."""
    f = _jsonl(tmp_path / "d.jsonl", [{"instruction": "Q", "response": "ab"}, {"text": "xy"}])
    stream = tokenize_documents(read_documents(f), ByteTokenizer())
    assert stream.ids.tolist() == [ord(c) for c in "Q\n\nab"] + [0] + [ord("x"), ord("y"), 0]
    assert stream.target.tolist() == [False] * 3 + [True] * 3 + [True] * 3
    data = PackedData(stream, seq=8)
    tokens, labels, _ = data.get([0])
    assert tokens[0].tolist() == stream.ids[:8].tolist()
    assert labels[0].tolist() == [-100, -100] + stream.ids[3:9].tolist()


def test_jsonl_masked_gradient_equals_transformers_with_ignored_prompt(tmp_path):
    """A loader batch of instruction records: the executor's loss and every gradient equal
    transformers' with labels -100 on the prompt; the prompt contributes nothing."""
    recs = [{"instruction": "p" * (3 + i % 5), "response": "r" * (2 + i % 3)} for i in range(40)]
    ds = load_dataset(_jsonl(tmp_path / "sft.jsonl", recs), ByteTokenizer(), seq=16, eval_fraction=0.0)
    tokens, labels, _ = ds.batches(4, seed=0).__next__()
    tokens, labels = tokens % 128, torch.where(labels >= 0, labels % 128, labels)  # 'p'=112, 'r'=114
    assert (labels == -100).sum() > 8 and (labels != -100).sum() > 8
    ref = tiny_hf("qwen2", seed=2)
    pol = exact_policy(batch=4, seq=16, micro_batches=2, optimizer="after", grad_clip=0.0)
    with Trainer(tiny_spec("qwen2"), pol, TrainerConfig(random_init=False)) as tr:
        tr.load_state_dict({n: p.detach() for n, p in ref.named_parameters()})
        loss, grads = executor_grads(tr, tokens, labels)
    ref_loss, ref_grads = hf_grads(ref, tokens, labels)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert max(rel_err(g, ref_grads[n]) for n, g in grads.items()) <= 1e-5
    # control: unmasking the prompt changes the loss, so the mask did something
    assert hf_grads(ref, tokens, torch.cat([tokens[:, 1:], tokens[:, :1]], 1))[0] != pytest.approx(ref_loss)


def test_text_file_is_one_document(tmp_path):
    (tmp_path / "a.txt").write_text("line one\nline two\n")
    docs = read_documents(tmp_path / "a.txt")
    assert len(docs) == 1 and docs[0].text == "line one\nline two\n" and docs[0].prompt is None


def test_long_text_tokenizes_in_pieces_without_losing_bytes():
    text = "".join(f"line {i} " + "x" * (i % 50) + "\n" for i in range(5000))  # ~160 KB
    stream = tokenize_documents([Document(text)], ByteTokenizer())
    assert stream.target is None
    assert bytes(stream.ids[:-1].tolist()) == text.encode() and stream.ids[-1] == 0


# ---- packing, split, shuffling -------------------------------------------------------------------

def test_packing_covers_every_token_once():
    ids = torch.arange(1, 104, dtype=torch.int32)  # 103 tokens
    data = PackedData(TokenStream(ids, None), seq=10)
    assert len(data) == 10  # (103 - 1) // 10
    tokens, labels, _ = data.get(range(10))
    assert tokens.dtype == labels.dtype == torch.int64 and tokens.shape == (10, 10)
    assert tokens.reshape(-1).tolist() == list(range(1, 101))
    assert labels.reshape(-1).tolist() == list(range(2, 102))


def test_eval_split_is_fixed_and_disjoint():
    tr1, ev1 = split_indices(100, 0.1)
    tr2, ev2 = split_indices(100, 0.1)
    assert torch.equal(ev1, ev2) and len(ev1) == 10 and len(tr1) == 90
    assert sorted(tr1.tolist() + ev1.tolist()) == list(range(100))
    assert split_indices(15, 0.05)[1].numel() == 0
    with pytest.raises(HorizonError, match="eval fraction"):
        split_indices(10, 1.0)


def _order(b: Batches, n: int):
    """The first token of each sequence of the next n batches (sequence i starts with 10 i)."""
    return [tuple(x.tokens[:, 0].tolist()) for x in (next(b) for _ in range(n))]


def test_shuffle_is_deterministic_by_seed_and_resumable():
    data = PackedData(TokenStream(torch.arange(0, 1001, dtype=torch.int32), None), seq=10)  # seq i starts at 10 i
    idx = torch.arange(100)
    a = _order(Batches(data, idx, 4, seed=1), 60)
    assert a == _order(Batches(data, idx, 4, seed=1), 60)
    assert a != _order(Batches(data, idx, 4, seed=2), 60)
    first_epoch = sorted(s for batch in a[:25] for s in batch)
    assert first_epoch == [10 * i for i in range(100)]  # every sequence once per epoch
    assert a[:25] != a[25:50]                           # a new order each epoch
    b = Batches(data, idx, 4, seed=1)
    _order(b, 37)
    st = json.loads(json.dumps(b.state_dict()))
    c = Batches(data, idx, 4, seed=1)
    c.load_state_dict(st)
    assert _order(c, 23) == a[37:]
    with pytest.raises(HorizonError, match="seed"):
        Batches(data, idx, 4, seed=3).load_state_dict(st)


def test_epoch_tail_is_skipped():
    data = PackedData(TokenStream(torch.arange(0, 101, dtype=torch.int32), None), seq=10)
    b = Batches(data, torch.arange(10), 4, seed=0)
    [next(b) for _ in range(2)]
    assert (b.epoch, b.pos) == (0, 8)
    next(b)
    assert (b.epoch, b.pos) == (1, 4)


# ---- tokenizers ----------------------------------------------------------------------------------

def _wordlevel(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3, "again": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_wordlevel_tokenizer_json(tmp_path):
    tok = HFTokenizer(_wordlevel(tmp_path / "tokenizer.json"))
    assert tok.vocab_size == 5 and tok.eos_id == 1
    assert tok.encode(["hello world", "again zzz"]) == [[2, 3], [4, 0]]
    f = _jsonl(tmp_path / "d.jsonl", [{"text": "hello world"}, {"instruction": "again", "response": "hello"}])
    stream = tokenize_documents(read_documents(f), tok)
    assert stream.ids.tolist() == [2, 3, 1, 4, 2, 1]
    assert stream.target.tolist() == [True, True, True, False, True, True]


def test_bpe_tokenizer_json_with_configured_eos(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([BUILTIN_CORPUS.read_text()[:20000]], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    t = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(t, HFTokenizer) and t.eos_id == 1 and t.vocab_size == 300
    text = "Return the number of items in a container."
    ids = t.encode([text])[0]
    assert len(ids) < len(text) and tok.decode(ids) == text
    ds = load_dataset(None, t, seq=64)
    assert ds.max_id < 300 and len(ds.train) > 50
    with pytest.raises(HorizonError, match="not in the vocabulary"):
        HFTokenizer(tmp_path / "tokenizer.json", eos_token="<nope>")


def test_byte_fallback_when_no_tokenizer():
    t = load_tokenizer(None)
    assert isinstance(t, ByteTokenizer) and t.vocab_size == 256 and t.eos_id == 0
    assert t.encode(["é!"]) == [[0xC3, 0xA9, 0x21]]


def test_builtin_corpus_dataset():
    ds = load_dataset(None, ByteTokenizer(), seq=128)
    assert ds.source.endswith("python_docs.txt") and ds.n_tokens > 300_000
    assert len(ds.eval) == int((ds.n_tokens - 1) // 128 * 0.05)
    ev = ds.eval_batches(4, 3)
    assert len(ev) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(ev, ds.eval_batches(4, 3)))
    assert set(ds.eval.tolist()).isdisjoint(ds.train.tolist())
    assert len(ds.data.fingerprint()) == 64


# ---- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("content,match", [
    ('{"text": "a"}\n{"text": \n', r"d.jsonl:2: not valid JSON"),
    ('["a"]\n', "want a JSON object"),
    ('{"prompt": "a"}\n', "want a 'text' field, 'instruction' and 'response', or 'messages'"),
    ('{"instruction": "a", "response": 3}\n', "field 'response' must be a string"),
    ('\n\n', "no text"),
])
def test_bad_jsonl_is_a_one_line_error(tmp_path, content, match):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(HorizonError, match=match) as e:
        read_documents(tmp_path / "d.jsonl")
    assert "\n" not in str(e.value)


def test_other_data_errors(tmp_path):
    with pytest.raises(HorizonError, match="not found"):
        read_documents(tmp_path / "missing.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(HorizonError, match="not UTF-8"):
        read_documents(tmp_path / "bin.txt")
    (tmp_path / "short.txt").write_text("tiny")
    with pytest.raises(HorizonError, match="do not fill one sequence"):
        load_dataset(tmp_path / "short.txt", ByteTokenizer(), seq=64)
    (tmp_path / "few.txt").write_text("x" * 300)
    ds = load_dataset(tmp_path / "few.txt", ByteTokenizer(), seq=64)
    with pytest.raises(HorizonError, match="a batch needs 8"):
        ds.batches(8, seed=0)
    with pytest.raises(HorizonError, match="not found"):
        HFTokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(HorizonError, match="not a tokenizers tokenizer.json"):
        HFTokenizer(tmp_path / "bad.json")
    _jsonl(tmp_path / "p.jsonl", [{"instruction": "x" * 100, "response": ""}])
    tok = ByteTokenizer()
    tok.eos_id = None
    with pytest.raises(HorizonError, match="nothing to train on"):
        load_dataset(tmp_path / "p.jsonl", tok, seq=8)
