"""GPT-2-shaped blocks as the published offload measurements describe them (Megatron-LM GPT-2
of DeepSpeed's and ZeRO-Offload's tables): LayerNorm (a weight and a bias per norm), q/k/v/o
projections, a plain (non-gated) GELU MLP, tied head. Planned only, and priced as closely as
those rows give: GPT-2's projection biases and learned positions (about 0.05% of the parameters)
are not counted, its LayerNorm is priced as an RMSNorm and its GELU as a SiLU. No config.json
maps to it and the executor does not run it (it is refused by name there)."""
from horizon_sim.specs.block_parts import (attention_kernels, attention_projections, block_tensors,
                                           dense_mlp_kernels, plain_mlp_projections)
from horizon_sim.specs.families.family import ModelFamily


def projections(m):
    return (*attention_projections(m, m.qkv_bias), *plain_mlp_projections(m, m.mlp_bias))


def kernels(m):
    return (*attention_kernels(m, qk_norm=False), *dense_mlp_kernels(m, gated=False))


def tensors(m):
    return block_tensors(m, projections(m), norm_tensors=("weight", "bias"))


FAMILY = ModelFamily("gpt2", "LayerNorm, plain GELU MLP (the published GPT-2 rows; planned only)",
                     projections, kernels, tensors, norm_tensors=("weight", "bias"))
