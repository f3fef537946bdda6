"""Training data: documents to batches (data.py), tokenizers (tokenize.py), chat records' tokens (chat_tokens.py), the built-in corpus (corpus/)."""
