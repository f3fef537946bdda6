"""Issue 42, item 4: preference pairs in (data/pairs.py) and `horizon train --objective dpo`. A
pair is two rows, the chosen then the rejected, labelled on the completion's tokens only (and
its end-of-document token), padded unlabelled; chat pairs label the completion's assistant
tokens only; a pair with no completion token within --seq is dropped and said; shuffling keeps
pairs whole; bad records are one-line errors; a run on pairs trains (its loss falls from log 2)."""
import json
import math

import pytest
import torch

from horizon_exec.data.data import IGNORE
from horizon_exec.data.pairs import load_pairs
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_sim.errors import HorizonError
from tests.hf_tokenizers import jsonl, tokenizer_folder
from tests.train_run import train

PAIRS = [{"prompt": "Q: 2+2?\nA:", "chosen": " 4", "rejected": " five"},
         {"prompt": "Sky?", "chosen": " Blue.", "rejected": " Green."}]


def test_text_pairs_label_the_completion_only(tmp_path):
    ds = load_pairs(jsonl(tmp_path / "p.jsonl", PAIRS), ByteTokenizer(), seq=24, eval_fraction=0.0)
    b = ds.data.get(torch.tensor([0, 1]))
    assert b.tokens.shape == b.labels.shape == (4, 24) and b.docs is None
    for row, (rec, which) in enumerate((r, w) for r in PAIRS for w in ("chosen", "rejected")):
        p, c = list(rec["prompt"].encode()), list(rec[which].encode()) + [0]  # + the end-of-document id
        ids = p + c
        assert b.tokens[row, :len(ids)].tolist() == ids
        want = [IGNORE] * (len(p) - 1) + c  # labels[t]: the next token, where it is the completion's
        assert b.labels[row].tolist() == want + [IGNORE] * (24 - len(want))


def test_a_pair_without_a_completion_token_is_dropped_and_said(tmp_path):
    said = []
    recs = PAIRS + [{"prompt": "x" * 40, "chosen": " y", "rejected": " z"}]
    ds = load_pairs(jsonl(tmp_path / "p.jsonl", recs), ByteTokenizer(), seq=24, eval_fraction=0.0, say=said.append)
    assert len(ds.data) == 2 and said == ["data: 1 pair(s) dropped: a row had no completion token within --seq 24"]


def test_batches_keep_pairs_whole(tmp_path):
    recs = [{"prompt": f"p{i}", "chosen": f" c{i}", "rejected": f" r{i}"} for i in range(10)]
    ds = load_pairs(jsonl(tmp_path / "p.jsonl", recs), ByteTokenizer(), seq=16, eval_fraction=0.0)
    b = next(ds.batches(4, seed=3))
    for c, r in zip(b.tokens[0::2], b.tokens[1::2]):
        text_c, text_r = bytes(c[c != 0].tolist()).decode(), bytes(r[r != 0].tolist()).decode()
        i = text_c[1:text_c.index(" ")]
        assert text_c == f"p{i} c{i}" and text_r == f"p{i} r{i}"


def test_chat_pairs_label_the_completions_assistant_tokens(tmp_path):
    from horizon_exec.data.tokenize import load_tokenizer
    tok = load_tokenizer(tokenizer_folder(tmp_path / "tok"))
    rec = {"prompt": [{"role": "user", "content": "Sky?"}], "chosen": [{"role": "assistant", "content": "Blue."}],
           "rejected": [{"role": "assistant", "content": "Green."}]}
    ds = load_pairs(jsonl(tmp_path / "p.jsonl", [rec]), tok, seq=48, eval_fraction=0.0)
    b = ds.data.get(torch.tensor([0]))
    for row, which in ((0, "chosen"), (1, "rejected")):
        text = tok.tok.decode([t for t in b.labels[row].tolist() if t != IGNORE], skip_special_tokens=False)
        assert text == rec[which][0]["content"] + "<|im_end|>\n", text  # the assistant's turn, as ChatML renders it


@pytest.mark.parametrize("rec, says", [
    ({"prompt": "a", "chosen": "b"}, "want 'prompt', 'chosen' and 'rejected' as strings, or as lists of messages"),
    ({"prompt": 3, "chosen": "b", "rejected": "c"}, "got prompt int and chosen str"),
])
def test_bad_records_are_one_line_errors(tmp_path, rec, says):
    with pytest.raises(HorizonError, match=says):
        load_pairs(jsonl(tmp_path / "p.jsonl", [rec]), ByteTokenizer(), seq=16)


def test_train_dpo_learns_and_refuses_without_pairs(tmp_path):
    data = jsonl(tmp_path / "p.jsonl", PAIRS * 8)
    r = train("--steps", "12", "--batch", "4", "--lora-rank", "8", "--objective", "dpo", "--data", data, "--lr", "1e-2",
              "--log-file", tmp_path / "log.jsonl")
    assert r.returncode == 0, r.stderr
    assert "DPO (sigmoid loss, beta 0.1) on preference pairs" in r.stdout
    losses = [json.loads(line)["loss"] for line in (tmp_path / "log.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-3)  # B starts at 0: the policy is the reference
    assert min(losses[-4:]) < 0.6
    r = train("--steps", "1", "--batch", "4", "--lora-rank", "8", "--objective", "dpo")
    assert r.returncode == 2 and "give --data FILE.jsonl with 'prompt', 'chosen' and 'rejected'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
