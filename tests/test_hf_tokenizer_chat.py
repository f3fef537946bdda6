"""Tokenizer features of HF folders, checked against transformers' AutoTokenizer:
- the special tokens a tokenizer adds around a text (Llama's BOS) are added per document, as
  `AutoTokenizer(text)` adds them, and are not targets;
- chat `messages` records are tokenized exactly as apply_chat_template(tokenize=True) does,
  with targets exactly transformers' own assistant mask ({% generation %} template), no
  end-of-document id after a template that ends with its end-of-turn token, in linear time;
- a folder with only a SentencePiece tokenizer.model is refused, not trained on bytes;
- document masks: per-token documents, positions restart, no target across a document start.
"""
import pytest
import torch

from horizon_exec.data.data import PackedData, load_dataset, read_documents, tokenize_documents
from horizon_exec.model.head import IGNORE
from horizon_exec.data.tokenize import load_tokenizer, tokenizer_of_folder
from horizon_sim.errors import HorizonError
from tests.hf_tokenizers import CHATML, LLAMA3, jsonl, tokenizer_folder

TEXTS = ["Return the number of items in a container.", "Hello world again"]
CHATS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a list?"},
     {"role": "assistant", "content": "A mutable sequence."}, {"role": "user", "content": "And a tuple?"},
     {"role": "assistant", "content": "An immutable one."}],
    [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
]


@pytest.mark.parametrize("bos", [False, True])
def test_documents_get_the_specials_autotokenizer_adds(tmp_path, bos):
    from transformers import AutoTokenizer
    d = tokenizer_folder(tmp_path / "tok", bos=bos)
    tok = load_tokenizer(d / "tokenizer.json")
    ref = AutoTokenizer.from_pretrained(str(d))
    stream = tokenize_documents(read_documents(jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS])), tok)
    want, tgt = [], []
    for t in TEXTS:
        ids = ref(t)["input_ids"]                       # add_special_tokens=True, transformers' default
        want += ids + [tok.eos_id]
        tgt += [not (bos and i == 0) for i in range(len(ids))] + [True]
    assert stream.ids.tolist() == want
    assert (stream.target.tolist() if stream.target is not None else [True] * len(want)) == tgt
    assert bos == (tok.prefix_ids == (ref.convert_tokens_to_ids("<s>"),))
    assert stream.starts.tolist() == [0, len(ref(TEXTS[0])["input_ids"]) + 1]


@pytest.mark.parametrize("bos", [False, True])
def test_chat_records_match_apply_chat_template_and_its_assistant_mask(tmp_path, bos):
    from transformers import AutoTokenizer
    d = tokenizer_folder(tmp_path / "tok", bos=bos)
    tok = load_tokenizer(d)
    ref = AutoTokenizer.from_pretrained(str(d))
    stream = tokenize_documents(read_documents(jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in CHATS])), tok)
    ids, tgt = [], []
    for chat in CHATS:
        out = ref.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids += list(out["input_ids"])   # no end-of-document id: the template ends with <|im_end|>\n
        tgt += [bool(m) for m in out["assistant_masks"]]
    assert stream.ids.tolist() == ids
    assert stream.target.tolist() == tgt
    assert sum(tgt) < len(tgt) / 2  # system and user turns are not trained on


def test_llama3_style_template_writes_its_own_bos(tmp_path):
    from transformers import AutoTokenizer
    d = tokenizer_folder(tmp_path / "tok", bos=True, template=LLAMA3)
    tok = load_tokenizer(d)
    ref = AutoTokenizer.from_pretrained(str(d))
    stream = tokenize_documents([read_documents(jsonl(tmp_path / "c.jsonl", [{"messages": CHATS[1]}]))[0]], tok)
    want = ref.apply_chat_template(CHATS[1], tokenize=True, return_dict=True)["input_ids"]
    assert stream.ids.tolist() == list(want) and want[0] == ref.convert_tokens_to_ids("<s>")
    text = ref.apply_chat_template(CHATS[1], tokenize=False)
    targets = [i for i, t in zip(want, stream.target.tolist()) if t]
    assert ref.decode(targets) == "hi<|eot_id|>"
    assert text.count("<s>") == 1


def test_chat_needs_a_template_and_a_real_tokenizer(tmp_path):
    f = jsonl(tmp_path / "c.jsonl", [{"messages": CHATS[1]}])
    with pytest.raises(HorizonError, match="chat template"):
        load_dataset(f, load_tokenizer(None), seq=8)
    d = tokenizer_folder(tmp_path / "tok", template=None)
    with pytest.raises(HorizonError, match="no chat template"):
        load_dataset(f, load_tokenizer(d), seq=8)
    with pytest.raises(HorizonError, match=r"bad.jsonl:1: 'messages' must be a non-empty list"):
        read_documents(jsonl(tmp_path / "bad.jsonl", [{"messages": []}]))
    with pytest.raises(HorizonError, match=r"messages\[1\] must be an object"):
        read_documents(jsonl(tmp_path / "bad2.jsonl", [{"messages": [{"role": "user", "content": "a"}, "x"]}]))


def test_sentencepiece_only_folder_is_refused(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x00")
    with pytest.raises(HorizonError, match="SentencePiece tokenizer.model but no tokenizer.json"):
        tokenizer_of_folder(tmp_path)
    assert tokenizer_of_folder(tmp_path / "nothing-here") is None


def test_document_masks_in_packed_batches(tmp_path):
    """Three documents: the docs index steps at each start, labels stop at document starts,
    and without document masks the same data gives the old, crossing labels."""
    d = tokenizer_folder(tmp_path / "tok", bos=True)
    tok = load_tokenizer(d)
    f = jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS * 8])
    ds = load_dataset(f, tok, seq=24, eval_fraction=0.0, doc_masks=True)
    plain = load_dataset(f, tok, seq=24, eval_fraction=0.0)
    starts = torch.zeros(ds.n_tokens + 1, dtype=torch.bool)
    starts[ds.data.stream.starts] = True
    b, p = ds.data.get(range(len(ds.data))), plain.data.get(range(len(ds.data)))
    assert torch.equal(b.tokens, p.tokens) and p.docs is None
    T = 24
    for i in range(len(ds.data)):
        row = starts[i * T:(i + 1) * T].clone()
        row[0] = False
        assert torch.equal(b.docs[i], row.to(torch.int64).cumsum(0))
        nxt = starts[i * T + 1:(i + 1) * T + 1]
        assert (b.labels[i][nxt] == IGNORE).all()              # a document's first token: no target
        assert torch.equal(b.labels[i][~nxt], p.labels[i][~nxt])
    assert ds.n_docs == 16 and ds.mean_doc_tokens == ds.n_tokens // 16
    assert ds.fingerprint() != plain.fingerprint()
    assert isinstance(ds.data, PackedData)


# ---- issue 30, section 6 ------------------------------------------------------------------------
NO_GENERATION = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# the generation block starts inside a word: the token 'er' of 'Answer' straddles its start
STRADDLE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ 'Answe' }}{% generation %}"
            "{{ 'ring: ' + m['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}"
            "{{ 'Question: ' + m['content'] + '\\n' }}{% endif %}{% endfor %}")
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _stream(tmp_path, template, chats):
    d = tokenizer_folder(tmp_path / "tok", template=template)
    tok = load_tokenizer(d)
    return tok, tokenize_documents(read_documents(jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in chats])), tok)


def _reference(tmp_path, template, chat):
    from transformers import AutoTokenizer
    d = tokenizer_folder(tmp_path / "ref", template=template)
    out = AutoTokenizer.from_pretrained(str(d)).apply_chat_template(chat, tokenize=True, return_dict=True,
                                                                    return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


def test_generation_block_mask_is_followed_exactly(tmp_path):
    """Every token overlapping the block is a target, one that straddles its start too."""
    want_ids, want_mask = _reference(tmp_path, STRADDLE, CHATS[0])
    _, s = _stream(tmp_path, STRADDLE, [CHATS[0]])
    assert s.ids.tolist() == want_ids and s.target.tolist() == want_mask


def test_template_without_generation_blocks(tmp_path):
    """The rule without blocks: an assistant turn runs from the end of the generation prompt
    before it to the end of its turn (content + end-of-turn text); for ChatML that is what the
    same template with generation blocks masks."""
    want_ids, want_mask = _reference(tmp_path, CHATML, CHATS[0])
    _, s = _stream(tmp_path, NO_GENERATION, [CHATS[0]])
    assert s.ids.tolist() == want_ids and s.target.tolist() == want_mask


def test_a_template_that_ends_without_a_special_token_gets_the_eos(tmp_path):
    from transformers import AutoTokenizer
    tok, s = _stream(tmp_path, PLAIN, [CHATS[1]])
    ref = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    want = list(ref.apply_chat_template(CHATS[1], tokenize=True, return_dict=True)["input_ids"])
    assert s.ids.tolist() == want + [tok.eos_id]
    assert s.target.tolist()[-1]        # the assistant's turn ends the conversation: its end is learnt
    # no generation prompt in this template: the turn's header is part of it, by the rule
    assert ref.decode([i for i, t in zip(s.ids.tolist(), s.target.tolist()) if t]) == "assistant: hi\n<|endoftext|>"


@pytest.mark.parametrize("template", ["generation", "none"])
def test_a_long_conversation_is_rendered_a_bounded_number_of_times(tmp_path, monkeypatch, template):
    """3000 turns: a few renders of the whole conversation, not one per prefix (rendering every
    prefix is quadratic: it took ~30 s here). Counted, not timed, so a busy machine cannot fail it."""
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} says something"}
            for i in range(3000)]
    d = tokenizer_folder(tmp_path / "tok", template=CHATML if template == "generation" else NO_GENERATION)
    tok = load_tokenizer(d)
    hf = tok.chat_reference()
    renders = []
    real = type(hf).apply_chat_template
    monkeypatch.setattr(type(hf), "apply_chat_template",
                        lambda self, *a, **k: renders.append(1) or real(self, *a, **k))
    s = tokenize_documents(read_documents(jsonl(tmp_path / "c.jsonl", [{"messages": chat}])), tok)
    assert 0 < len(renders) <= 8, f"{len(renders)} renders for 3000 turns"
    assert s.target.sum() > 0
