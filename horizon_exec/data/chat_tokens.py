"""A chat record's token ids and targets, equal to transformers' apply_chat_template, in time
linear in the conversation's length.

    ids, targets = chat_tokens(tokenizer, messages, tools)

- ids are apply_chat_template(messages, tools=tools, tokenize=True)'s. Nothing is appended
  when the rendered conversation ends with a special token (a template that closes each turn
  with its end-of-turn token: <|im_end|>, <|eot_id|>, </s>; whitespace after it aside); else
  the end-of-document id follows, a target when the last turn is the assistant's.
- A template with `{% generation %}` blocks: targets are exactly transformers' assistant mask
  (return_assistant_tokens_mask=True: every token that overlaps a generation block).
- A template without them: an assistant turn spans from the end of the generation prompt
  that precedes it (the render of the messages before it with add_generation_prompt) to the
  end of its own turn (the render of the messages through it): its content and the template's
  end-of-turn text. Targets are the tokens overlapping a span, by the same overlap rule.

The spans come from one render: each assistant content is wrapped in two private-use marker
characters, the markers' positions are where the contents are, and the text a turn adds
around its content (the generation prompt's tail before it, the end-of-turn text after it)
is measured once on the first assistant turn by rendering its prefixes. The result is checked
against the prefix renders on the last assistant turn too (one more render each); a template
the markers change, or whose turns differ, is handled by rendering every prefix (quadratic,
the same rule). A template that rewrites earlier turns is refused.
"""
from horizon_sim.errors import HorizonError

_OPEN, _CLOSE = "\ue000", "\ue001"  # Unicode private use: not in real chat text (checked)


def chat_tokens(tokenizer, messages: list, tools=None) -> tuple[list[int], list[bool]]:
    """(ids, targets) of one conversation (see the module docstring)."""
    hf = tokenizer.chat_reference()      # transformers' tokenizer of the folder, with its template
    try:
        if has_generation_blocks(hf.chat_template):
            out = hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
            ids, targets = list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
        else:
            text, spans = render_spans(hf, messages, tools, tokenizer.folder)
            ids, offsets = tokenizer.encode_offsets(text)
            targets = overlap_mask(offsets, spans)
    except HorizonError:
        raise
    except Exception as e:  # the template raised (raise_exception), or a message is malformed
        raise HorizonError(f"chat template of {tokenizer.folder}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if tokenizer.eos_id is not None and not ends_with_special(tokenizer, ids):
        ids.append(tokenizer.eos_id)
        targets.append(messages[-1].get("role") == "assistant")
    return ids, targets


def has_generation_blocks(template: str) -> bool:
    import re
    return bool(re.search(r"\{%-?\s*generation\s*-?%\}", template or ""))


def overlap_mask(offsets, spans) -> list[bool]:
    """A token is a target when its characters overlap a span (transformers' rule for its
    assistant mask); spans and offsets both ascend, one pass."""
    mask, k = [False] * len(offsets), 0
    for i, (a, b) in enumerate(offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        mask[i] = b > spans[k][0]
    return mask


def ends_with_special(tokenizer, ids: list[int]) -> bool:
    """The last token that is not whitespace is a special (added) token: the template ended the
    conversation with its own end-of-turn token, and an end-of-document id would be extra."""
    special = tokenizer.special_ids
    for i in reversed(ids):
        if i in special:
            return True
        if tokenizer.tok.decode([i], skip_special_tokens=False).strip():
            return False
    return False


def render_spans(hf, messages: list, tools, folder) -> tuple[str, list[tuple[int, int]]]:
    """(text, [(start, end) of each assistant turn]) as the module docstring says."""
    def render(msgs, gen=False):
        return hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen) if msgs else ""

    full = render(messages)
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        return full, []
    fast = _marked_spans(render, messages, turns, full)
    if fast is not None:
        return full, fast
    spans = [_prefix_span(render, messages, i, full, folder) for i in turns]
    return full, spans


def _prefix_span(render, messages, i, full, folder) -> tuple[int, int]:
    before = render(messages[:i], gen=True)
    upto = full if i + 1 == len(messages) else render(messages[:i + 1])
    if not (upto.startswith(before) and full.startswith(upto)):
        raise HorizonError(f"the chat template of {folder} does not render a conversation prefix by prefix "
                           "(it rewrites earlier turns), so the assistant's tokens cannot be told apart; "
                           "use 'instruction'/'response' records")
    return len(before), len(upto)


def _marked_spans(render, messages, turns, full):
    """The spans from one marked render, or None when the markers cannot be used."""
    if any(not isinstance(messages[i].get("content"), str) for i in turns) or _OPEN in full or _CLOSE in full:
        return None
    marked_msgs = [({**m, "content": _OPEN + m["content"] + _CLOSE} if k in turns else m)
                   for k, m in enumerate(messages)]
    marked = render(marked_msgs)
    contents, removed, pos = [], 0, 0   # (start, end) of each content in the unmarked text
    while True:
        a = marked.find(_OPEN, pos)
        if a < 0:
            break
        b = marked.find(_CLOSE, a)
        if b < 0:
            return None
        contents.append((a - removed, b - removed - 1))
        removed += 2
        pos = b + 1
    if len(contents) != len(turns) or marked.replace(_OPEN, "").replace(_CLOSE, "") != full:
        return None  # the template moved, dropped or transformed a content
    # what a turn adds around its content, measured on the first assistant turn
    try:
        first = _prefix_span(render, messages, turns[0], full, "")
    except HorizonError:
        return None
    lead, trail = contents[0][0] - first[0], first[1] - contents[0][1]
    if lead < 0 or trail < 0:
        return None
    head, tail = full[first[0]:contents[0][0]], full[contents[0][1]:first[1]]
    spans = []
    for a, b in contents:
        if full[a - lead:a] != head or full[b:b + trail] != tail:
            return None
        spans.append((a - lead, b + trail))
    if len(turns) > 1:  # the last turn, the other end of the conversation, checked too
        try:
            if _prefix_span(render, messages, turns[-1], full, "") != spans[-1]:
                return None
        except HorizonError:
            return None
    return spans
