"""Preference pairs for DPO (Policy.objective 'dpo'): a JSONL file of records

    {"prompt": "...", "chosen": "...", "rejected": "..."}                       text, as TRL takes them
    {"prompt": [messages], "chosen": [messages], "rejected": [messages]}        conversational

Text: the prompt's ids (with the tokenizer's own prefix, a BOS where it adds one), then the
completion's and the end-of-document token (TRL adds the EOS too). Conversational: the chat
template renders the prompt's messages and then prompt + completion; the completion is what the
second adds to the first, and only its assistant tokens are trained on (data/chat_tokens.py).
Each pair is two rows of `seq` tokens, the chosen then the rejected: a row's labels are its next
token where that token is the completion's, else -100, and it is padded after its end (the
end-of-document id, or 0) with nothing labelled. A row longer than seq + 1 tokens keeps its start
(the completion's end is cut, as TRL's default truncation does); a pair left without a completion
token in either row is dropped, and the loader says how many. Pairs are shuffled and held out
whole (data.Batches over pair indices)."""
import hashlib
from dataclasses import dataclass

import torch

from horizon_exec.data.data import IGNORE, Batch, Batches, Dataset, split_indices
from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import loads_json


class PairData:
    """Pairs i = 0..n-1 as rows 2i (chosen) and 2i + 1 (rejected) of (2n, seq) tokens and labels."""

    doc_masks = False  # a row is one prompt and completion: nothing packed to mask apart

    def __init__(self, tokens: torch.Tensor, labels: torch.Tensor, seq: int):
        self.tokens, self.labels, self.seq = tokens, labels, seq

    def __len__(self) -> int:
        return self.tokens.shape[0] // 2

    def get(self, idx) -> Batch:
        """The pairs `idx`, interleaved: (2 len(idx), seq) tokens and labels, chosen before rejected."""
        chosen = 2 * torch.as_tensor(idx, dtype=torch.int64)
        rows = torch.stack([chosen, chosen + 1], dim=1).reshape(-1)
        return Batch(self.tokens[rows], self.labels[rows], None)

    def fingerprint(self) -> str:
        h = hashlib.sha256(f"pairs;seq={self.seq};".encode())
        h.update(self.tokens.to(torch.int32).numpy().tobytes())
        h.update(self.labels.to(torch.int32).numpy().tobytes())
        return h.hexdigest()


@dataclass(frozen=True, slots=True)
class PairDataset(Dataset):
    """A Dataset of preference pairs: its indices are pairs, and a batch of B rows takes B / 2."""

    def batches(self, batch: int, seed: int) -> Batches:
        return Batches(self.data, self.train, batch // 2, seed)

    def eval_batches(self, batch: int, n_batches: int) -> list[Batch]:
        k = min(n_batches, len(self.eval) // (batch // 2))
        return [self.data.get(self.eval[i * (batch // 2):(i + 1) * (batch // 2)]) for i in range(k)]


def _text_row(tok, prompt: str, completion: str) -> tuple[list[int], list[bool]]:
    p = list(tok.prefix_ids) + tok.encode([prompt])[0]
    c = tok.encode([completion])[0] + ([tok.eos_id] if tok.eos_id is not None else [])
    return p + c, [False] * len(p) + [True] * len(c)


def _chat_row(tok, prompt: list, completion: list, where: str) -> tuple[list[int], list[bool]]:
    from horizon_exec.data.chat_tokens import chat_tokens
    p_ids, _ = chat_tokens(tok, prompt)
    ids, targets = chat_tokens(tok, prompt + completion)
    if ids[:len(p_ids)] != p_ids and ids[:len(p_ids) - 1] == p_ids[:-1]:
        p_ids = p_ids[:-1]  # the end-of-document id chat_tokens appends to a conversation on its own
    n = len(p_ids)
    if ids[:n] != p_ids:
        raise HorizonError(f"{where}: the chat template renders the prompt differently with the completion after it; "
                           "give the pair as text (prompt, chosen, rejected strings)")
    return ids, [t and i >= n for i, t in enumerate(targets)]


def _row(tok, rec: dict, which: str, where: str) -> tuple[list[int], list[bool]]:
    prompt, completion = rec.get("prompt"), rec.get(which)
    if isinstance(prompt, str) and isinstance(completion, str):
        return _text_row(tok, prompt, completion)
    if isinstance(prompt, list) and isinstance(completion, list):
        return _chat_row(tok, prompt, completion, where)
    raise HorizonError(f"{where}: want 'prompt', 'chosen' and 'rejected' as strings, or as lists of messages; got "
                       f"prompt {type(prompt).__name__} and {which} {type(completion).__name__}")


def _tensors(ids: list[int], targets: list[bool], seq: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, targets = ids[:seq + 1], targets[:seq + 1]
    t = torch.full((seq + 1,), pad, dtype=torch.int64)
    t[:len(ids)] = torch.tensor(ids, dtype=torch.int64)
    keep = torch.zeros(seq + 1, dtype=torch.bool)
    keep[:len(targets)] = torch.tensor(targets, dtype=torch.bool)
    return t[:seq], torch.where(keep[1:], t[1:], IGNORE)


def pairs_bytes_bound(path, seq: int) -> int:
    """Host bytes load_pairs holds at most (the admission counts them before loading): two rows of
    seq int64 tokens and labels per record (a line), and the split's indices."""
    if path is None:
        return 0
    try:
        with open(path, "rb") as f:
            records = sum(1 for line in f if line.strip())
    except OSError:
        return 0  # load_pairs says why
    return records * (2 * 2 * 8 * seq + 4 * 8)


def load_pairs(path, tokenizer, seq: int, eval_fraction: float = 0.05, say=print) -> PairDataset:
    """The preference pairs of the JSONL file `path` (module docstring), tokenized into rows of seq."""
    if path is None:
        raise HorizonError("--objective dpo trains on preference pairs: give --data FILE.jsonl with 'prompt', "
                           "'chosen' and 'rejected' in each record")
    toks, labs, dropped, max_id = [], [], 0, 0
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise HorizonError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            rec = loads_json(line, where)
            if not isinstance(rec, dict):
                raise HorizonError(f"{where}: want a JSON object, got {type(rec).__name__}")
            rows = [_tensors(*_row(tokenizer, rec, which, where), seq, pad) for which in ("chosen", "rejected")]
            if any(bool((lab == IGNORE).all()) for _, lab in rows):
                dropped += 1
                continue
            for t, lab in rows:
                toks.append(t)
                labs.append(lab)
                max_id = max(max_id, int(t.max()))
    if not toks:
        raise HorizonError(f"{path}: no pair with a completion token in both rows within --seq {seq}")
    if dropped:
        say(f"data: {dropped} pair(s) dropped: a row had no completion token within --seq {seq}")
    data = PairData(torch.stack(toks), torch.stack(labs), seq)
    train, ev = split_indices(len(data), eval_fraction)
    return PairDataset(data, train, ev, str(path), sum(int((t != pad).sum()) for t in toks), max_id, len(data))
