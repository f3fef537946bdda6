"""Model templates: the decoder block and head as functions of named weights, flat parameter layouts, RoPE tables, and the transformers adapter."""
