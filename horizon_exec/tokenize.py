"""Tokenizers for `horizon train`: a local tokenizer.json through the `tokenizers` library, or
byte-level tokens when none is given.

Both have .encode(texts) -> list of id lists (no special tokens added), .vocab_size and
.eos_id (appended after every document when packing; None: documents are simply
concatenated). No network: a tokenizer is a file on disk.
"""
import json
from pathlib import Path

from horizon_sim.errors import HorizonError

# End-of-document tokens, in the order they are looked for when tokenizer_config.json does
# not name one: GPT-2/Qwen, Llama-2/Mistral, Llama-3, Gemma.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255. Id 0 (NUL, which text does not contain) ends a document."""

    name = "bytes"
    vocab_size = 256
    eos_id = 0

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]


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
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        eos_token = eos_token or _configured_eos(p.parent / "tokenizer_config.json")
        if eos_token is not None:
            self.eos_id = self.tok.token_to_id(eos_token)
            if self.eos_id is None:
                raise HorizonError(f"{p}: end-of-document token {eos_token!r} is not in the vocabulary")
        else:
            self.eos_id = next((i for c in EOS_CANDIDATES if (i := self.tok.token_to_id(c)) is not None), None)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]


def _configured_eos(cfg_path: Path) -> str | None:
    if not cfg_path.is_file():
        return None
    try:
        eos = json.loads(cfg_path.read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def load_tokenizer(path=None, eos_token: str | None = None):
    """HFTokenizer(path), or ByteTokenizer when path is None."""
    return ByteTokenizer() if path is None else HFTokenizer(path, eos_token)
