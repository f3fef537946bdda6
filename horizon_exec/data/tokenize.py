"""Tokenizers for `horizon train`: a local tokenizer.json through the `tokenizers` library, or
byte-level tokens when none is given.

Both have .encode(texts) -> list of id lists (no special tokens added), .vocab_size, .eos_id
(appended after every document when packing; None: documents are simply concatenated),
.prefix_ids / .suffix_ids (the special tokens the tokenizer puts around one text, e.g. Llama's
BOS: what `AutoTokenizer(text)` adds with add_special_tokens) and .files (what to carry into a
saved checkpoint). An HFTokenizer also renders chat `messages` through the folder's chat
template (transformers' apply_chat_template, the reference implementation).
No network: a tokenizer is a file on disk.
"""
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import read_json

BYTES = "bytes"
"""--tokenizer's name for ByteTokenizer (an --init-from folder without a tokenizer needs it said)."""
# End-of-document tokens, in the order they are looked for when tokenizer_config.json does
# not name one: GPT-2/Qwen, Llama-2/Mistral, Llama-3, Gemma.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
# Files of a tokenizer folder that a saved model carries along: every one transformers' tokenizer
# classes of the supported families read (fast and slow: a slow or sentencepiece-based load of
# the saved folder needs tokenizer.model, vocab.json + merges.txt, Mistral's tekken.json /
# tokenizer.model.v3).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "added_tokens.json",
                   "tokenizer.model", "tokenizer.model.v3", "vocab.json", "merges.txt", "tekken.json")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255. Id 0 (NUL, which text does not contain) ends a document."""

    name = "bytes"
    vocab_size = 256
    eos_id = 0
    prefix_ids: tuple[int, ...] = ()
    suffix_ids: tuple[int, ...] = ()
    files: tuple[Path, ...] = ()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def chat_reference(self):
        raise HorizonError("chat data ('messages') needs a tokenizer with a chat template "
                           "(--tokenizer, or an --init-from folder holding tokenizer.json)")


class HFTokenizer:
    """A tokenizer.json (any model: BPE, WordPiece, Unigram, WordLevel) via `tokenizers`."""

    def __init__(self, path, eos_token: str | None = None):
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise HorizonError(f"tokenizer {str(p)!r} not found (want a tokenizer.json)")
        from tokenizers import Tokenizer
        try:
            self.tok = Tokenizer.from_file(str(p))
        except Exception as e:  # the library raises a bare Exception on bad JSON
            raise HorizonError(f"{p}: not a tokenizers tokenizer.json ({str(e).splitlines()[0]})") from None
        self.name = str(p)
        self.folder = p.parent
        _check_unknown_words(self.tok, p)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        eos_token = eos_token or _configured_eos(p.parent / "tokenizer_config.json")
        if eos_token is not None:
            self.eos_id = self.tok.token_to_id(eos_token)
            if self.eos_id is None:
                raise HorizonError(f"{p}: end-of-document token {eos_token!r} is not in the vocabulary")
        else:
            self.eos_id = next((i for c in EOS_CANDIDATES if (i := self.tok.token_to_id(c)) is not None), None)
        try:
            self.prefix_ids, self.suffix_ids = self._specials()
        except Exception as e:  # the library raises a bare Exception when a text cannot be encoded
            raise HorizonError(f"{p}: cannot encode a probe text ({str(e).splitlines()[0] if str(e) else e})") from None
        # The file itself plus its folder's companions (config, special tokens, chat template).
        self.files = (p, *(self.folder / n for n in TOKENIZER_FILES[1:] if (self.folder / n).is_file()))
        self._hf = None
        self._special = None

    def _specials(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the tokenizer's post-processor puts before and after one text (transformers
        5 takes them from tokenizer.json whenever there is one)."""
        probe = "a"
        plain = self.tok.encode(probe, add_special_tokens=False).ids
        full = self.tok.encode(probe, add_special_tokens=True).ids
        for i in range(len(full) - len(plain) + 1):
            if full[i:i + len(plain)] == plain:
                return tuple(full[:i]), tuple(full[i + len(plain):])
        return (), ()

    def encode(self, texts: list) -> list[list[int]]:
        """ids of each text: a str, or a pieces.Piece (its text encoded, the ids of the tokens
        that start in its own characters kept)."""
        from horizon_exec.data.pieces import Piece
        encs = self._encode_batch([t.text if isinstance(t, Piece) else t for t in texts])
        out = []
        for t, e in zip(texts, encs):
            ids = _own_ids(e, t.start, t.end) if isinstance(t, Piece) else e.ids
            # a token across an end of the piece's own characters: they are encoded without
            # context instead (lossless: the pieces' ids still cover the text exactly once)
            out.append(ids if ids is not None else self.encode([t.own])[0])
        return out

    def _encode_batch(self, texts: list[str]):
        try:
            return self.tok.encode_batch(texts, add_special_tokens=False)
        except Exception as e:  # the library's bare Exception / TypeError: one line naming the file
            raise HorizonError(f"{self.name}: cannot encode the data ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})") from None

    def stitch_at(self, text: str, cut: int, window: int) -> int | None:
        """Where to cut `text` near `cut`, in [cut - window/2, cut], when no space allows an
        exact cut (pieces.py), the two sides each encoded with `window` characters of the
        other as context: the latest token start where two encodings with different contexts
        (2 windows + 1 on the left and 1 on the right; 1 on the left and 2 on the right) give
        the same tokens over the window around `cut`, so the ids there do not depend on where
        the text was cut. When they differ (the choices there depend on more context, e.g.
        the phase of the merges in a run of one letter that began earlier), the latest place
        both start a token at (ids may differ around it); None when there is none."""
        half = window // 2
        spans = ((max(0, cut - 2 * window - 1), min(len(text), cut + window)),
                 (max(0, cut - window), min(len(text), cut + 2 * window)))
        a, b = self._encode_batch([text[s:e] for s, e in spans])
        near = []
        for (s, _), enc in zip(spans, (a, b)):
            near.append([(s + o0, s + o1, i) for i, (o0, o1) in zip(enc.ids, enc.offsets)
                         if cut - half <= s + o0 and s + o1 <= cut + half])
        if near[0] and near[0] == near[1]:
            starts = [s for s, _, _ in near[0] if s <= cut]
        else:   # no agreement: at least a place both encodings start a token at (ids may differ there)
            starts = sorted({s for s, _, _ in near[0]} & {s for s, _, _ in near[1]})
            starts = [s for s in starts if s <= cut]
        return starts[-1] if starts and starts[-1] > cut - half else None

    def keeps_ids_at(self, text: str, cut: int, window: int = 1024) -> bool:
        """Whether tokenizing text[:cut] and text[cut:] apart gives the ids of the whole
        around the cut (checked on `window` characters either side: a pre-tokenizer's split
        there makes the cut exact; a SentencePiece tokenizer would add its word-start mark to
        a piece that begins a line, and one without pre-tokenizer merges across anything)."""
        left, right = text[max(0, cut - window):cut], text[cut:cut + window]
        a, b, whole = self.tok.encode_batch([left, right, left + right], add_special_tokens=False)
        return a.ids + b.ids == whole.ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """ids and (start, end) character offsets of one text, no special tokens added."""
        try:
            e = self.tok.encode(text, add_special_tokens=False)
        except Exception as e:
            raise HorizonError(f"{self.name}: cannot encode the data ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})") from None
        return e.ids, e.offsets

    def render_chat(self, messages: list, tools=None) -> tuple[str, list[tuple[int, int]]]:
        """(text, [(start, end) character spans of the assistant turns]) of one conversation,
        rendered by the folder's chat template exactly as apply_chat_template renders it; the
        spans as chat_tokens.py defines them (without {% generation %} blocks)."""
        from horizon_exec.data.chat_tokens import render_spans
        try:
            return render_spans(self.chat_reference(), messages, tools, self.folder)
        except HorizonError:
            raise
        except Exception as e:  # the template raised (raise_exception), or a message is malformed
            raise HorizonError(f"chat template of {self.folder}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from None

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special added tokens (<|im_end|>, <|eot_id|>, </s>...)."""
        if self._special is None:
            self._special = frozenset(i for i, t in self.tok.get_added_tokens_decoder().items() if t.special)
        return self._special

    def chat_reference(self):
        """transformers' tokenizer of the folder (its chat template is the reference)."""
        return self._transformers()

    def _transformers(self):
        if self._hf is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise HorizonError("chat data ('messages') renders the tokenizer's chat template with "
                                   "transformers: pip install transformers") from None
            try:
                self._hf = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
            except Exception as e:
                raise HorizonError(f"{self.folder}: transformers cannot load this tokenizer "
                                   f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
            if not getattr(self._hf, "chat_template", None):
                raise HorizonError(f"{self.folder}: no chat template (chat_template.jinja, or chat_template "
                                   "in tokenizer_config.json); chat data ('messages') needs one")
        return self._hf


def _own_ids(enc, start: int, end: int) -> list[int] | None:
    """The ids of the tokens of `enc` that start in characters [start, end); None when a token
    runs across start or end (the kept ids would not cover those characters exactly once).
    Token starts ascend; found by bisection over the encoding's offsets."""
    n = len(enc.ids)

    def first_from(pos: int) -> int:   # index of the first token starting at or after pos
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if (enc.token_to_chars(mid) or (0, 0))[0] < pos:
                lo = mid + 1
            else:
                hi = mid
        return lo

    i, j = first_from(start), first_from(end)
    for k, edge in ((i, start), (j, end)):
        if k > 0 and (enc.token_to_chars(k - 1) or (0, 0))[1] > edge:
            return None
    return enc.ids[i:j]


def _check_unknown_words(tok, path: Path) -> None:
    """A WordLevel model fails on every word outside its vocabulary unless its unk token is in
    it; the `tokenizers` library then raises deep inside a batch (and even on the probe text
    the specials are found with, so a vocabulary that covers the data does not help). Refused
    up front, naming the file."""
    from tokenizers import models
    m = tok.model
    if isinstance(m, models.WordLevel):
        unk = m.unk_token
        if not unk or tok.token_to_id(unk) is None:
            raise HorizonError(f"{path}: a WordLevel tokenizer whose unk token {unk!r} is not in its vocabulary "
                               "cannot encode a word outside it; add the unk token to the vocabulary")


def _configured_eos(cfg_path: Path) -> str | None:
    if not cfg_path.is_file():
        return None
    # A file that cannot be read is refused, naming it, not skipped: the run would pick another
    # end-of-document token than the one configured, and --save-hf copy the broken file.
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise HorizonError(f"{cfg_path}: want a JSON object, got {type(cfg).__name__}")
    eos = cfg.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def tokenizer_of_folder(folder) -> Path | None:
    """The tokenizer.json of a model folder; None when it has no tokenizer at all. A folder
    with only a SentencePiece tokenizer.model is refused (training it on byte tokens would be
    silently wrong)."""
    d = Path(folder)
    if (d / "tokenizer.json").is_file():
        return d / "tokenizer.json"
    if (d / "tokenizer.model").is_file():
        raise HorizonError(
            f"{d} has a SentencePiece tokenizer.model but no tokenizer.json, which Horizon reads; write "
            f"one with: python -c \"from transformers import AutoTokenizer as T; "
            f"T.from_pretrained('{d}').save_pretrained('{d}')\" (needs sentencepiece), or pass --tokenizer")
    return None


def resolve_tokenizer(name) -> Path:
    """--tokenizer: a tokenizer.json, a folder holding one, or a model id in the local HF cache."""
    from horizon_sim.specs.hf_cache import looks_like_model_id, resolve_model_dir
    s = str(name)
    if looks_like_model_id(s):
        return resolve_model_dir(s, need="tokenizer.json") / "tokenizer.json"
    p = Path(s)
    if p.is_dir():
        return tokenizer_of_folder(p) or p / "tokenizer.json"   # HFTokenizer says it is missing
    return p


def load_tokenizer(path=None, eos_token: str | None = None):
    """HFTokenizer(path), or ByteTokenizer when path is None."""
    return ByteTokenizer() if path is None else HFTokenizer(path, eos_token)
