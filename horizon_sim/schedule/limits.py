"""Sizes the planner and the executor accept, checked before any work whose amount grows with
them (the schedule has about 8 ops per layer and micro-batch, and the simulator and the
executor take time and memory per op), so an absurd input is a one-line refusal, not a run
that hangs or exhausts memory. Each bound is far above what real models use; the time and
memory a step's work takes do not otherwise depend on batch, seq or the model's widths (the
loss chunks of the head are one cost entry however many there are: schedule/work.py).
"""
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.work import check_adapter_targets
from horizon_sim.specs.families import family

MAX_LAYERS = 512
"""Decoder blocks. The deepest published LLMs have 96 (GPT-3), 105 (MT-NLG 530B), 118 (PaLM
540B) and 126 (Llama-3.1-405B); 512 is 4x that. A 512-layer step is ~4,100 ops, simulated in
~0.5 s on one core (a search such as `horizon tune` runs ~100 of them)."""
MAX_LAYER_PASSES = 32768
"""micro_batches x (n_layers + 1): the forward/backward passes over a streamed unit in one
step, which the op count of the Schedule the executor runs follows (~8 ops each; 32,768 is
~260,000 ops). E.g. 256 micro-batches of a 126-layer model. The planner builds and simulates
at most a few thousand of them whatever the count (sim/extend.py)."""
MAX_WIDTH = 2**20
"""hidden, ffn_hidden, and the query and key/value widths (heads x head_dim). The widest
published models have hidden 20480 (MT-NLG) and ffn_hidden 73728 (PaLM, Nemotron-4); 2^20
is 14x the latter, and keeps every FLOP and byte count a finite float."""
MAX_VOCAB = 2**24
"""Vocabulary. The largest published ones have ~262,000 entries (Gemma 3); 2^24 is 64x that."""


OPS_PER_PASS = 8
"""About how many ops a layer pass makes."""


def layer_passes(n_layers: int, micro_batches: int) -> int:
    """The forward/backward passes over a streamed unit in one step: micro_batches x (n_layers + 1)."""
    return micro_batches * (n_layers + 1)


def _check(what: str, value: int, limit: int, why: str) -> None:
    if value > limit:
        raise HorizonError(f"{what}={value} is beyond what the planner takes ({why}); allowed: "
                           f"1..{limit:,}")


def check_sizes(model, policy) -> None:
    """Refuse a model and policy whose step would be too big to build or simulate (module
    docstring); the policy's own fields are bounded in Policy."""
    _check("model n_layers", model.n_layers, MAX_LAYERS,
           "the deepest published LLMs have up to 126 layers")
    for name, v in (("hidden", model.hidden), ("ffn_hidden", model.ffn_hidden),
                    ("q_dim (n_heads x head_dim)", model.q_dim), ("kv_dim (n_kv_heads x head_dim)", model.kv_dim)):
        _check(f"model {name}", v, MAX_WIDTH, "the widest published layers are 73,728 wide")
    _check("model vocab", model.vocab, MAX_VOCAB, "the largest published vocabularies have ~262,000 entries")
    if family(model.family).learned_positions and 0 < model.max_position < policy.seq:
        raise HorizonError(f"policy seq={policy.seq} is beyond the {model.max_position} learned positions of model "
                           f"{model.name!r} (its position embedding's rows); allowed: seq 1..{model.max_position} "
                           f"(--seq {model.max_position})")
    passes = layer_passes(model.n_layers, policy.micro_batches)
    if passes > MAX_LAYER_PASSES:
        raise HorizonError(
            f"policy micro_batches={policy.micro_batches} with {model.n_layers} layers makes "
            f"{passes:,} layer passes per step (micro_batches x (layers + 1)), ~{OPS_PER_PASS * passes:,} ops; "
            f"allowed: up to {MAX_LAYER_PASSES:,}, i.e. micro_batches <= "
            f"{MAX_LAYER_PASSES // (model.n_layers + 1)} for this model (fewer, larger micro-batches)")
    check_adapter_targets(model, policy)
