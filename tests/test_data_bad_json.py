"""Issue 30: JSONL records that are valid JSON to some readers but not text, or too big to
read: each is one line naming file:line (the CLI: exit 2 before training), not a
UnicodeEncodeError / TypeError from the tokenizer, a ValueError or a RecursionError."""
import pytest

from horizon_exec.data.data import load_dataset
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_sim.errors import HorizonError

OK = '{"text": "' + "fine text " * 20 + '"}\n'
BAD = {
    "surrogate_text": ('{"text": "bad \\ud800"}\n', "lone surrogate"),
    "surrogate_messages": ('{"messages": [{"role": "user", "content": "bad \\ud800"}, '
                           '{"role": "assistant", "content": "ok"}]}\n', "lone surrogate"),
    "surrogate_key": ('{"text": "x", "\\udfff": 1}\n', "lone surrogate"),
    "digits_5000": ('{"text": ' + "9" * 5000 + '}\n', "4300 digits"),
    "nested_100000": ('{"text": ' + "[" * 100000 + "]" * 100000 + '}\n', "nested too deeply"),
    "text_not_string": ('{"text": ["a", "b"]}\n', "'text' must be a string"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_record_is_one_line_naming_file_and_line(tmp_path, name):
    line, says = BAD[name]
    p = tmp_path / "d.jsonl"
    p.write_text(OK + line, encoding="utf-8")
    with pytest.raises(HorizonError) as e:
        load_dataset(p, ByteTokenizer(), 8, 0.0)
    msg = str(e.value)
    assert msg.startswith(f"{p}:2: ") and says in msg and "\n" not in msg, msg


def test_a_surrogate_pair_is_text(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(OK + '{"text": "emoji \\ud83d\\ude00 fine"}\n')
    assert load_dataset(p, ByteTokenizer(), 8, 0.0).n_tokens > 0


def test_chat_template_failure_names_the_record(tmp_path):
    """A message the template cannot render (content not a string: `'<' + 5` raises inside
    jinja) names file:line and the template's folder, in one line."""
    from horizon_exec.data.tokenize import load_tokenizer
    from tests.hf_tokenizers import tokenizer_folder
    tok = load_tokenizer(tokenizer_folder(tmp_path / "tok", template=(
        "{% for m in messages %}{{ '<' + m['content'] + '>' }}{% endfor %}")))
    p = tmp_path / "d.jsonl"
    p.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n'
                 '{"messages": [{"role": "user", "content": 5}]}\n')
    with pytest.raises(HorizonError, match=rf"^{p}:2: chat template of .*tok") as e:
        load_dataset(p, tok, 8, 0.0)
    assert "\n" not in str(e.value)
