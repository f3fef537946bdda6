"""Training data for `horizon train`: documents -> token stream -> packed sequences -> batches.

Inputs
- .jsonl: one JSON object per line, either {"text": ...} (every token is a target),
  {"instruction": ..., "response": ...} (optionally "input"), formatted as
  PROMPT_FORMAT + response (prompt tokens are not targets: label -100; the response and
  the end-of-document token are), or {"messages": [{"role": ..., "content": ...}, ...]}
  (optionally "tools"): a conversation rendered by the tokenizer's chat template, exactly
  as transformers' apply_chat_template renders it, with loss on the assistant turns only
  (chat_tokens.py: its ids and assistant mask; no end-of-document id after a template that
  ends with its end-of-turn token).
- any other file (.txt, .md, ...): UTF-8 text, the whole file one document.
- none: the built-in corpus (BUILTIN_CORPUS).

Documents are tokenized (tokenize.py: a tokenizer.json or bytes; a long one in bounded pieces,
pieces.py: cut where the ids do not change, so they are the whole text's, and where a text
allows no such cut, at most PIECE_CHARS characters on anyway) with the special tokens the
tokenizer adds around a text (Llama's BOS; not targets: they carry nothing to predict), each
followed by the tokenizer's end-of-document id, and concatenated into one stream. Packing
cuts the stream into sequences of `seq` tokens whose targets are the next `seq` tokens
(windows overlap by one, so every token but the first is a target exactly once). By default
a sequence may span documents and attention runs across them; with document masks
(doc_masks=True) each batch also says which document every token belongs to, the executor
restarts positions and masks attention at document starts, and a document's first token is
not a target of the previous document's last. Labels are -100 where the target is a prompt
token.

A fixed share of the sequences (chosen by a fixed seed, independent of the run's seed) is
held out for eval. Training batches walk a permutation of the rest, a new one per epoch,
drawn from (seed, epoch): the order is a pure function of the seed, and a loader's whole
state is (epoch, position), which is what a checkpoint stores.
"""
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from horizon_exec.data.pieces import PIECE_CHARS, own_text, piece_utf8_bytes, pieces_of, text_pieces
from horizon_exec.model.head import IGNORE
from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import refuse_non_regular
from horizon_sim.safe_read import loads_json

BUILTIN_CORPUS = Path(__file__).parent / "corpus" / "python_docs.txt"
"""~360 KB of English prose (Python standard library docstrings, PSF License) shipped with
the package, so the demo and tests train on real text without downloading anything."""
PROMPT_FORMAT = "{instruction}\n\n"
PROMPT_WITH_INPUT_FORMAT = "{instruction}\n\n{input}\n\n"
SPLIT_SEED = 0x5EED  # the eval split does not move with --seed
TEMPLATE_TOKENS_PER_RECORD = 128
"""A chat template's own tokens per conversation beyond the record's bytes (role headers,
default system prompts): an allowance for the admission's data bound."""
TOKENIZE_BYTES_PER_TEXT_BYTE = 256
"""Peak bytes the `tokenizers` library holds per UTF-8 byte of the texts it encodes at once,
with a margin: measured 202-212 (VmHWM growth of one encode_batch, in a fresh process, with
tests/hf_tokenizers.bpe, a byte-level BPE: one text of 64 Ki, 1 Mi and 4 Mi random 'ACGT'
characters, one token each; 16 texts of 64 Ki under RAYON_NUM_THREADS=16, all in flight; 192-202
on a run of 'a'; 186 per byte on CJK text, 3 tokens a character; 52 per byte on English prose,
0.25 tokens a byte, so the figure is the token-per-byte worst case). It is linear in what is
encoded at once, hence pieces (pieces.py) and TOKENIZE_BATCH_TEXT_BYTES."""
TOKENIZE_BATCH_TEXT_BYTES = 1 << 19
"""UTF-8 bytes of text (context included) handed to the tokenizer at once, at most: pieces are
batched up to this (one piece, at most 4 x (PIECE_CHARS + 2 CUT_WINDOW) bytes, fits alone)."""
TOKENIZE_BATCH_BYTES = TOKENIZE_BATCH_TEXT_BYTES * (TOKENIZE_BYTES_PER_TEXT_BYTE + 36 + 16) + 16 * PIECE_CHARS
"""What tokenizing holds at most, counted by the admission (data_bytes_bound): the tokenizer's
working set for one batch, the id lists it returns (Python ints, ~36 bytes a token, at most a
token a byte), the batch's strings (up to 4 bytes a character, twice: the piece and its slice of
the text being cut) and the text being cut (a few pieces of PIECE_CHARS)."""


@dataclass(frozen=True, slots=True)
class Document:
    text: str
    """What is trained on (for an instruction record: the response)."""
    prompt: str | None = None
    """Context that is fed but not trained on (instruction records)."""


@dataclass(frozen=True, slots=True)
class Chat:
    """A conversation: rendered by the tokenizer's chat template, trained on its assistant turns."""
    messages: tuple
    tools: list | None = None
    where: str = ""
    """file:line of the record, for errors raised while it is rendered."""


class Batch(NamedTuple):
    tokens: torch.Tensor
    """(n, seq) int64."""
    labels: torch.Tensor
    """(n, seq) int64 targets, -100 = none."""
    docs: torch.Tensor | None
    """(n, seq) int64 document of each token within its sequence (document masks), else None."""


def _field(rec: dict, key: str, where: str, required: bool = True):
    v = rec.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str):
        raise HorizonError(f"{where}: field {key!r} must be a string, got {type(v).__name__}")
    return v


def _record(rec, where: str):
    if not isinstance(rec, dict):
        raise HorizonError(f"{where}: want a JSON object, got {type(rec).__name__}")
    if "messages" in rec:
        return _chat(rec, where)
    if "text" in rec:
        return Document(_field(rec, "text", where))
    if "instruction" in rec and "response" in rec:
        inst = _field(rec, "instruction", where)
        inp = _field(rec, "input", where, required=False)
        prompt = (PROMPT_WITH_INPUT_FORMAT.format(instruction=inst, input=inp) if inp
                  else PROMPT_FORMAT.format(instruction=inst))
        return Document(_field(rec, "response", where), prompt)
    raise HorizonError(f"{where}: want a 'text' field, 'instruction' and 'response', or "
                       f"'messages'; got keys {sorted(rec)[:6]}")


def iter_jsonl(path):
    """Documents of a .jsonl file, one record at a time (the file is never held whole)."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            # huge integers, deep nesting and lone surrogates (not text: the tokenizer would
            # fail on one deep inside a batch) are one line naming file:line (safe_read.py)
            rec = loads_json(line, where)
            yield _record(rec, where)


def _chat(rec: dict, where: str) -> Chat:
    msgs = rec["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise HorizonError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise HorizonError(f"{where}: messages[{i}] must be an object with a string 'role'")
    tools = rec.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise HorizonError(f"{where}: 'tools' must be a list")
    return Chat(tuple(msgs), tools, where)


@dataclass(frozen=True, slots=True)
class TextFile:
    """A text file as one document, read piece by piece when it is tokenized."""
    path: Path

    def pieces(self, tokenizer=None):
        """The file's pieces for `tokenizer` (pieces.pieces_of; None: bytes), read block by
        block: the text held at once is a few pieces whatever the file's size."""
        with open(self.path, encoding="utf-8") as f:
            yield from pieces_of(iter(lambda: f.read(PIECE_CHARS), ""), tokenizer)


def _source(path) -> Path:
    p = Path(path) if path is not None else BUILTIN_CORPUS
    refuse_non_regular(p, "data file")  # a FIFO is not a file to read twice (sized, then loaded)
    if not p.is_file():
        raise HorizonError(f"data file {str(p)!r} not found")
    return p


def _is_jsonl(p: Path) -> bool:
    return p.suffix.lower() in (".jsonl", ".ndjson")


def iter_documents(path=None):
    """Documents of a .jsonl or text file (the built-in corpus when path is None), lazily:
    JSONL one record at a time, a text file as one TextFile."""
    p = _source(path)
    if _is_jsonl(p):
        yield from iter_jsonl(p)
    else:
        yield TextFile(p)


def _read_errors(p: Path):
    """Reading errors of `p` as one-line HorizonErrors."""
    import contextlib

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except UnicodeDecodeError as e:
            raise HorizonError(f"{p}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise HorizonError(f"{p}: cannot read ({e})") from None
    return guard()


def read_documents(path=None) -> list:
    """Documents of a .jsonl or text file as a list (small files and tests; training streams
    them: load_dataset)."""
    p = _source(path)
    with _read_errors(p):
        docs = list(iter_documents(p))
        if not any(isinstance(d, (Chat, TextFile)) or d.text or d.prompt for d in docs):
            raise HorizonError(f"{p}: no text in it")
        return [Document("".join(map(own_text, d.pieces()))) if isinstance(d, TextFile) else d for d in docs]


def id_dtype(vocab_size: int) -> torch.dtype:
    """The narrowest signed integer dtype that holds every id (int16 for byte-level and small
    vocabularies: half of int32's bytes per token)."""
    return torch.int16 if vocab_size <= 2**15 else torch.int32


@dataclass(frozen=True, slots=True)
class TokenStream:
    ids: torch.Tensor
    """(N,) int16 or int32 (id_dtype): every document's tokens then its end-of-document id."""
    target: torch.Tensor | None
    """(N,) bool: the token may be predicted (False on prompt and BOS tokens); None = all True."""
    starts: torch.Tensor | None = None
    """(D,) int64 ascending: the position of each document's first token; None = one document."""

    @property
    def n_docs(self) -> int:
        return 1 if self.starts is None else max(1, self.starts.numel())


def _doc_pieces(d, tokenizer):
    """(is_target, text or ids) parts of a plain document, in order: the tokenizer's prefix
    specials, the prompt, the text, its suffix specials and the end-of-document id."""
    if tokenizer.prefix_ids:
        yield False, list(tokenizer.prefix_ids)
    if isinstance(d, TextFile):
        yield from ((True, p) for p in d.pieces(tokenizer))
    else:
        if d.prompt:
            yield from ((False, p) for p in text_pieces(d.prompt, tokenizer))
        if d.text:
            yield from ((True, p) for p in text_pieces(d.text, tokenizer))
    yield True, _closing_ids(tokenizer)


def _closing_ids(tokenizer) -> list[int]:
    """Suffix specials, then the end-of-document id unless the suffix already ends with it."""
    tail = list(tokenizer.suffix_ids)
    if tokenizer.eos_id is not None and tail[-1:] != [tokenizer.eos_id]:
        tail.append(tokenizer.eos_id)
    return tail


def _chat_parts(c: Chat, tokenizer):
    """(ids, target mask) of a rendered conversation: apply_chat_template's ids and assistant
    mask (chat_tokens.py); an error names the record."""
    from horizon_exec.data.chat_tokens import chat_tokens
    try:
        return chat_tokens(tokenizer, list(c.messages), c.tools)
    except HorizonError as e:
        raise HorizonError(f"{c.where}: {e}" if c.where else str(e)) from None


class _Sink:
    """Token buffers that grow in place: ids preallocated to an upper bound (pages never
    written are never resident), target flags only once a non-target token appears, and
    document starts as indices. Grows by doubling past the bound (one copy)."""

    def __init__(self, dtype, capacity: int):
        self.ids = torch.empty(max(1, capacity), dtype=dtype)
        self.target: torch.Tensor | None = None
        self.starts: list[int] = []
        self.n = 0

    def _room(self, k: int) -> None:
        if self.n + k > self.ids.numel():
            cap = max(2 * self.ids.numel(), self.n + k)
            ids = torch.empty(cap, dtype=self.ids.dtype)
            ids[:self.n] = self.ids[:self.n]
            self.ids = ids
            if self.target is not None:
                tgt = torch.empty(cap, dtype=torch.bool)
                tgt[:self.n] = self.target[:self.n]
                self.target = tgt

    def add(self, ids, target, first: bool) -> None:
        k = len(ids)
        if not k:
            return
        self._room(k)
        if first:
            self.starts.append(self.n)
        self.ids[self.n:self.n + k] = torch.as_tensor(ids, dtype=torch.int64)
        all_true = target is True or (not isinstance(target, bool) and all(target))
        if not all_true and self.target is None:
            self.target = torch.empty(self.ids.numel(), dtype=torch.bool)
            self.target[:self.n] = True
        if self.target is not None:
            self.target[self.n:self.n + k] = target if isinstance(target, bool) else torch.tensor(target)
        self.n += k

    def stream(self) -> TokenStream:
        n = self.n
        return TokenStream(self.ids[:n], None if self.target is None else self.target[:n],
                           torch.tensor(self.starts, dtype=torch.int64))


def tokenize_documents(docs, tokenizer, pieces_per_batch: int = 16, capacity: int = 0) -> TokenStream:
    """Encode an iterable of documents in batches of pieces (at most TOKENIZE_BATCH_TEXT_BYTES
    of text at a time), straight into growing token buffers: memory is the tokens (id_dtype)
    plus one batch (TOKENIZE_BATCH_BYTES), whatever the length of a document.
    capacity: an upper bound of the token count, to allocate the buffers once."""
    sink = _Sink(id_dtype(tokenizer.vocab_size), capacity or 1 << 16)
    batch: list = []        # (is_target, text (str or Piece) or ids, opens a document)
    pending = [False]       # a document has begun and its first token is still to come
    text_bytes = [0]        # UTF-8 bytes of the batch's texts

    def is_text(part) -> bool:
        return not isinstance(part, list)

    def flush():
        enc = iter(tokenizer.encode([t for _, t, _ in batch if is_text(t)]))
        text_bytes[0] = 0
        for is_target, part, first in batch:
            ids = next(enc) if is_text(part) else part
            pending[0] |= first
            if ids:
                sink.add(ids, is_target, pending[0])
                pending[0] = False
        batch.clear()

    for d in docs:
        if isinstance(d, Chat):
            flush()
            cids, ctgt = _chat_parts(d, tokenizer)
            sink.add(cids, ctgt, True)
            continue
        first = True
        for is_target, part in _doc_pieces(d, tokenizer):
            n_bytes = piece_utf8_bytes(part) if is_text(part) else 0
            if text_bytes[0] + n_bytes > TOKENIZE_BATCH_TEXT_BYTES:
                flush()
            text_bytes[0] += n_bytes
            batch.append((is_target, part, first))
            first = False
            if len(batch) >= pieces_per_batch:
                flush()
    flush()
    return sink.stream()


def token_bound(path=None, tokenizer=None) -> int:
    """An upper bound of the tokens `path` makes: every token covers at least one byte of
    text (byte-level BPE, byte fallback, word pieces), plus per record the specials the
    tokenizer adds, the end-of-document id and, for chat records, the template's own tokens
    (TEMPLATE_TOKENS_PER_RECORD)."""
    p = _source(path)
    size = p.stat().st_size
    extra = len(getattr(tokenizer, "prefix_ids", ())) + len(getattr(tokenizer, "suffix_ids", ())) + 1
    if not _is_jsonl(p):
        return size + extra
    records, _, _ = _jsonl_lines(p)
    return size + (records + 1) * (extra + TEMPLATE_TOKENS_PER_RECORD)


CHAT_KEY = b'"messages"'


def _jsonl_lines(p: Path) -> tuple[int, int, int]:
    """(newlines, bytes of the longest line, bytes of the longest line that may be a chat
    record) of a JSONL file, read in 4 MB blocks. A line 'may be a chat record' when it holds
    CHAT_KEY anywhere (a text that quotes it is counted too: the safe side)."""
    records = longest = longest_chat = run = 0
    run_chat, tail = False, b""   # the line still open at a block's end: its key seen, its last bytes
    with open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            lines = chunk.split(b"\n")
            records += len(lines) - 1
            first_chat = run_chat or CHAT_KEY in tail + lines[0][:len(CHAT_KEY)] or CHAT_KEY in lines[0]
            if len(lines) == 1:
                run += len(chunk)
                run_chat, tail = first_chat, (tail + chunk)[-len(CHAT_KEY):]
                continue
            whole = [(run + len(lines[0]), first_chat)] + [(len(ln), CHAT_KEY in ln) for ln in lines[1:-1]]
            longest = max(longest, *(n for n, _ in whole))
            longest_chat = max(longest_chat, *(n if chat else 0 for n, chat in whole))
            run, run_chat, tail = len(lines[-1]), CHAT_KEY in lines[-1], lines[-1][-len(CHAT_KEY):]
    return records, max(longest, run), max(longest_chat, run if run_chat else 0)


RECORD_BYTES_PER_LINE_BYTE = 8
"""What reading one JSONL record holds while it is tokenized, per byte of its line: the line
and the record's text as Python strings (two; up to 4 bytes a character each, once one
character needs 4; a character is at least one byte of the line)."""


def data_bytes_bound(path, tokenizer, seq: int) -> int:
    """Host bytes a loaded dataset holds at most (the admission counts them before loading):
    ids (id_dtype), target flags, document starts (8 bytes per record at most one per
    token), the train/eval index permutations, and tokenizing: one batch of bounded pieces
    whatever the length of a document (TOKENIZE_BATCH_BYTES) and the JSONL record being read
    (RECORD_BYTES_PER_LINE_BYTE of its longest line). A chat record is rendered by its template
    and tokenized whole (chat_tokens.py: transformers' assistant masks need the conversation's
    offsets), so the longest line that may be one is counted at TOKENIZE_BYTES_PER_TEXT_BYTE."""
    n = token_bound(path, tokenizer)
    per_token = id_dtype(tokenizer.vocab_size).itemsize + 1
    starts = 8 * min(n, n // 2 + 1)
    indices = 4 * 8 * (n // max(1, seq) + 1)          # train and eval indices, and a permutation of each
    p = _source(path)
    record = 0
    if _is_jsonl(p):
        _, line, chat = _jsonl_lines(p)
        record = RECORD_BYTES_PER_LINE_BYTE * line + TOKENIZE_BYTES_PER_TEXT_BYTE * chat
    return n * per_token + starts + indices + TOKENIZE_BATCH_BYTES + record


class PackedData:
    """Sequences i = 0..n-1 of a token stream: tokens stream[i*seq : i*seq+seq], targets
    stream[i*seq+1 : i*seq+seq+1] (-100 where the target is not to be trained on). With
    doc_masks, also each token's document within the sequence, and no target across a
    document start."""

    def __init__(self, stream: TokenStream, seq: int, doc_masks: bool = False):
        if doc_masks and stream.starts is None:
            stream = TokenStream(stream.ids, stream.target, torch.zeros(1, dtype=torch.int64))
        self.stream, self.seq, self.doc_masks = stream, seq, doc_masks
        self.n = max(0, (stream.ids.numel() - 1) // seq)

    def __len__(self) -> int:
        return self.n

    def _opens(self, a: int, b: int) -> torch.Tensor:
        """(b - a,) bool: which positions a..b-1 open a document."""
        st = self.stream.starts
        lo, hi = torch.searchsorted(st, torch.tensor([a, b])).tolist()
        out = torch.zeros(b - a, dtype=torch.bool)
        out[st[lo:hi] - a] = True
        return out

    def get(self, idx) -> Batch:
        """tokens, labels, docs: (len(idx), seq) int64 (docs None without document masks)."""
        s = self.seq
        ids, tgt = self.stream.ids, self.stream.target
        toks, labs, docs = [], [], []
        for i in (int(i) for i in idx):
            a = i * s
            toks.append(ids[a:a + s])
            lab = ids[a + 1:a + s + 1].to(torch.int64)
            if tgt is not None:
                lab = torch.where(tgt[a + 1:a + s + 1], lab, IGNORE)
            if self.doc_masks:
                opens = self._opens(a, a + s + 1)
                lab = torch.where(opens[1:], IGNORE, lab)          # the next token opens a document
                opens[0] = False
                docs.append(opens[:s].to(torch.int64).cumsum(0))
            labs.append(lab)
        return Batch(torch.stack(toks).to(torch.int64), torch.stack(labs),
                     torch.stack(docs) if self.doc_masks else None)

    def fingerprint(self) -> str:
        """SHA-256 of the stream (ids as int32, whatever dtype holds them: fingerprints of
        older checkpoints stay valid), the targets, seq (and document starts under document
        masks): a resumed run checks it reads the same data. Hashed in slices (no copy of
        the whole stream)."""
        h = hashlib.sha256(f"seq={self.seq};".encode())
        ids, step = self.stream.ids, 1 << 22
        for a in range(0, ids.numel(), step):
            h.update(ids[a:a + step].to(torch.int32).numpy().data)
        if self.stream.target is not None:
            h.update(self.stream.target.numpy().data)
        if self.doc_masks:
            h.update(b"docs;" + self.stream.starts.numpy().tobytes())
        return h.hexdigest()


def split_indices(n: int, eval_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, eval) sequence indices, each ascending; eval gets floor(n * eval_fraction),
    picked by a fixed seed."""
    if not 0.0 <= eval_fraction < 1.0:
        raise HorizonError(f"eval fraction {eval_fraction} must lie in [0, 1)")
    n_eval = int(n * eval_fraction)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    return perm[n_eval:].sort().values, perm[:n_eval].sort().values


class Batches:
    """Endless training batches: `batch` sequences at a time from a permutation of
    `indices` drawn from (seed, epoch); the tail of an epoch that does not fill a batch is
    skipped. State: (epoch, pos)."""

    def __init__(self, data: PackedData, indices: torch.Tensor, batch: int, seed: int = 0):
        if len(indices) < batch:
            raise HorizonError(f"the data gives {len(indices)} training sequences of {data.seq} tokens; "
                               f"a batch needs {batch} (use more data, or a smaller --batch or --seq)")
        self.data, self.indices, self.batch, self.seed = data, indices, batch, seed
        self.epoch, self.pos = 0, 0
        self._perm_epoch, self._perm = None, None

    def _order(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % (1 << 63))
            self._perm = self.indices[torch.randperm(len(self.indices), generator=g)]
            self._perm_epoch = self.epoch
        return self._perm

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        if self.pos + self.batch > len(self.indices):
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self._order()[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return self.data.get(idx)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed}

    def load_state_dict(self, st: dict) -> None:
        if st.get("seed") != self.seed:
            raise HorizonError(f"checkpoint's data order seed {st.get('seed')} differs from --seed {self.seed}")
        self.epoch, self.pos = int(st["epoch"]), int(st["pos"])


@dataclass(frozen=True, slots=True)
class Dataset:
    data: PackedData
    train: torch.Tensor
    """Indices of training sequences."""
    eval: torch.Tensor
    """Indices of held-out sequences (maybe empty)."""
    source: str
    n_tokens: int
    max_id: int
    n_docs: int = 1

    @property
    def mean_doc_tokens(self) -> int:
        """Tokens per document on average (model FLOPs under document masks)."""
        return max(1, self.n_tokens // max(1, self.n_docs))

    def fingerprint(self) -> str:
        """SHA-256 of the packed data and the train/eval split."""
        h = hashlib.sha256(self.data.fingerprint().encode())
        h.update(self.train.numpy().tobytes())
        return h.hexdigest()

    def batches(self, batch: int, seed: int) -> Batches:
        return Batches(self.data, self.train, batch, seed)

    def eval_batches(self, batch: int, n_batches: int) -> list[Batch]:
        """The first n_batches full batches of the held-out set (always the same ones)."""
        k = min(n_batches, len(self.eval) // batch)
        return [self.data.get(self.eval[i * batch:(i + 1) * batch]) for i in range(k)]


def load_dataset(path, tokenizer, seq: int, eval_fraction: float = 0.05, doc_masks: bool = False) -> Dataset:
    """Read, tokenize and pack `path` (None: the built-in corpus), streaming: the file is read
    piece by piece (JSONL record by record) straight into token buffers; doc_masks: batches
    say which document each token belongs to (see PackedData)."""
    p = _source(path)
    with _read_errors(p):
        stream = tokenize_documents(iter_documents(p), tokenizer, capacity=token_bound(p, tokenizer))
    if stream.ids.numel() == 0:
        raise HorizonError(f"{p}: no text in it")
    if stream.target is not None and not bool(stream.target.any()):
        raise HorizonError(f"{p}: every token is a prompt token; nothing to train on")
    data = PackedData(stream, seq, doc_masks)
    if len(data) == 0:
        raise HorizonError(f"{p}: {stream.ids.numel()} tokens do not fill one sequence of {seq} (+1) tokens")
    train, ev = split_indices(len(data), eval_fraction)
    return Dataset(data, train, ev, str(p), stream.ids.numel(),
                   int(stream.ids.max()) if stream.ids.numel() else 0, stream.n_docs)
