"""Small HF tokenizer folders for the tests (no downloads): a byte-level BPE trained on the
built-in corpus, saved by transformers with a chat template, with or without a BOS that the
tokenizer adds to every text."""
import json

from horizon_exec.data.data import BUILTIN_CORPUS

# Qwen2-style ChatML; the assistant's content and end-of-turn inside {% generation %}, so
# transformers can give its own assistant mask to compare with.
CHATML = ("{% for message in messages %}{% if message['role'] == 'assistant' %}"
          "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>\\n' }}"
          "{% endgeneration %}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama-3 style: the template writes the BOS itself.
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
          "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>"]
VOCAB = 320


def bpe(bos: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([BUILTIN_CORPUS.read_text()[:30000]], trainer)
    if bos:  # like Llama's tokenizer.json: every text gets <s> in front
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def tokenizer_folder(path, bos: bool = False, template: str = CHATML, eos: str = "<|endoftext|>"):
    """A folder as transformers saves it: tokenizer.json, tokenizer_config.json and
    chat_template.jinja."""
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=bpe(bos), bos_token="<s>", eos_token=eos,
                                 pad_token="<|endoftext|>", chat_template=template)
    hf.save_pretrained(str(path))
    assert (path / "tokenizer.json").is_file()
    return path


def jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
