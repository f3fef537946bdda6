"""The host optimizer: AdamW on one unit's flat buffers, its native kernel, the learning-rate schedule."""
