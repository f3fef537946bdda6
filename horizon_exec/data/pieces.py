"""Long texts cut into bounded pieces for tokenizing (issue 30 section 6; issue 43 item 3).

The `tokenizers` library holds ~210 bytes per UTF-8 byte of the text it encodes at once
(data.TOKENIZE_BYTES_PER_TEXT_BYTE says how it was measured), so a text is never handed to it whole: it is cut into pieces
of at most PIECE_CHARS characters of its own plus CUT_WINDOW of context either side, and the
peak of tokenizing is bounded by the piece, not by the document.

Where a piece ends, in this order:
1. an exact cut: after a newline, else before a space, in the last half of the piece, where
   the tokenizer's keeps_ids_at says that encoding the two sides apart gives the ids of the
   whole (checked on CUT_WINDOW characters either side: a pre-tokenizer's split there makes
   it exact; ByteTokenizer has no check: every cut is exact for bytes).
2. a stitched cut, when no such place exists (a DNA-like sequence, a run of letters, a
   tokenizer without pre-tokenizer that merges across spaces): the tokenizer's stitch_at
   picks a token start near the end of the piece where two encodings with different
   contexts (2 windows left + 1 right, 1 left + 2 right) give the same tokens around it, and
   each side is encoded with CUT_WINDOW characters of the other as context and keeps only the
   tokens that start in its own characters (a Piece). The ids are the whole text's wherever
   the tokenizer's choices there depend on less than half a window of context either side,
   which the two encodings' agreement evidences (tests: random DNA, a run of one letter).
3. when the two encodings differ there (a run of one letter that began before both windows:
   BPE pairs its merges from the run's start), the latest place where both start a token;
   failing that (a token longer than half a window), the end of the piece, not before a
   combining mark (a normalizer such as NFKC composes it with its base). Encoded the same way
   with context. Only the tokens at such a cut may differ from tokenizing the text whole
   (tests: 3 tokens at one cut in a run of 'a' between DNA).

Lossless in every case: the pieces' own characters join to the text, and a Piece's kept ids
cover exactly its own characters: HFTokenizer.encode checks that no token runs across either
end of them, and otherwise encodes the piece's own characters without context (then a
tokenizer that marks the start of a text, SentencePiece's Prepend('▁'), marks that piece's
start too: decoded, one space more; not seen in the tests' runs with tokens of up to 16).
"""
import unicodedata
from dataclasses import dataclass

PIECE_CHARS = 1 << 16
"""Characters of its own a piece holds at most (plus CUT_WINDOW of context either side)."""
CUT_WINDOW = 1024
"""Characters either side of a candidate cut that the tokenizer checks, and the context a
stitched piece is encoded with."""
_CUT_TRIES = 8  # candidate exact cuts of each kind tried per piece before stitching


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece encoded with context: `text` is encoded, the ids kept are those of the tokens
    that start in text[start:end], the piece's own characters."""
    text: str
    start: int
    end: int

    @property
    def own(self) -> str:
        return self.text[self.start:self.end]


def own_text(piece) -> str:
    """The characters a piece (str or Piece) contributes to the document."""
    return piece.own if isinstance(piece, Piece) else piece


def piece_utf8_bytes(piece) -> int:
    """UTF-8 bytes the tokenizer is handed for a piece (its context included)."""
    t = piece.text if isinstance(piece, Piece) else piece
    return len(t) if t.isascii() else len(t.encode("utf-8"))


def pieces_of(chunks, tokenizer=None):
    """The pieces (str, or Piece where context is needed) of a text given as consecutive
    chunks (a file read in blocks, or one string), cut as the module docstring says; the
    text held at once stays within a few pieces whatever its length. tokenizer None: bytes."""
    keeps = getattr(tokenizer, "keeps_ids_at", None)
    stitch = getattr(tokenizer, "stitch_at", None)
    buf, ctx = "", 0            # buf[:ctx]: context already yielded; buf[ctx:]: still to yield
    for chunk in chunks:
        buf += chunk
        while len(buf) - ctx > PIECE_CHARS + CUT_WINDOW:   # a cut then has a window on its right
            piece, buf, ctx = _next_piece(buf, ctx, keeps, stitch)
            yield piece
    while len(buf) - ctx > PIECE_CHARS:                    # the end of the text is its right side
        piece, buf, ctx = _next_piece(buf, ctx, keeps, stitch)
        yield piece
    if len(buf) > ctx:
        yield _piece(buf, ctx, len(buf), len(buf))


def text_pieces(text: str, tokenizer=None) -> list:
    """pieces_of one string, as a list."""
    return list(pieces_of((text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)), tokenizer))


def _next_piece(buf: str, ctx: int, keeps, stitch):
    """(piece, the buffer left, its context length): the next piece of buf[ctx:]."""
    lo, hi = ctx + PIECE_CHARS // 2, ctx + PIECE_CHARS
    cut = _exact_cut(buf, lo, hi, keeps)
    if cut is not None:     # the next piece needs no context: its ids do not depend on ours
        return _piece(buf, ctx, cut, cut), buf[cut:], 0
    if stitch is None:      # bytes: any cut is exact
        return _piece(buf, ctx, hi, hi), buf[hi:], 0
    cut = stitch(buf, hi, CUT_WINDOW)
    if cut is None or not lo < cut <= hi:
        cut = _forced_cut(buf, lo, hi)
    left = max(0, cut - CUT_WINDOW)
    return _piece(buf, ctx, cut, min(len(buf), cut + CUT_WINDOW)), buf[left:], cut - left


def _piece(buf: str, start: int, end: int, text_end: int):
    """buf[start:end] as a plain string when it needs no context, else a Piece."""
    if start == 0 and end == text_end:
        return buf[:end]
    return Piece(buf[:text_end], start, end)


def _exact_cut(text: str, lo: int, hi: int, keeps) -> int | None:
    """A cut in (lo, hi] where the ids do not change: after a newline, else before a space
    (a SentencePiece tokenizer marks a word start with the space, not the newline), the
    latest first; None when no candidate keeps them."""
    if hi <= lo:
        return None
    for mark, after in (("\n", 1), (" ", 0)):
        end = hi
        for _ in range(_CUT_TRIES):
            i = text.rfind(mark, lo, end)
            if i < 0:
                break
            cut = i + after
            if lo < cut < len(text) and (keeps is None or keeps(text, cut)):
                return cut
            end = i
    return None


def _forced_cut(text: str, lo: int, hi: int) -> int:
    """hi, moved back past combining marks and joiners (a normalizer such as NFKC composes
    them with the character before)."""
    cut = hi
    while cut > lo + 1 and (unicodedata.category(text[cut])[0] == "M" or text[cut] in "\u200c\u200d"):
        cut -= 1
    return cut
