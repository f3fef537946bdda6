"""LoRA adapters in a block's forward (Policy.lora_rank): every projection the families run goes
through `linear` (or `adapt`, for GPT-2's Conv1D), which adds the projection's adapter when the
weights carry one, as peft's LoRA Linear does (y = base(x) + B(A(x)) * alpha / r, the adapter
path in the adapters' dtype, the sum rounded once to y's dtype), in three kernels beyond the
rank-r GEMMs: the input cast to the adapters' dtype (once per input: q, k and v share theirs),
the scale applied to the rank-r product, and the sum added into the base's output in place.
(peft scales after B: the two orders differ by fp32 rounding, below 1e-6 relative.) With
dropout (Policy.lora_dropout, training only) each adapter's input is masked first, as peft's
lora_dropout does, by a mask of its own (AdapterDropout). What these kernels move and keep is
priced by schedule/work.py (adapter_elementwise_bytes, ...).

A routed-expert stack's adapters (peft's target_parameters: one (A_e, B_e) per expert) apply
to each expert's routed rows inside the experts' loop (`expert_adapters`, `adapt_rows`), their
own cast per expert and no dropout (peft has none there). peft folds them into the stack's
weight (W_e + s B_e A_e) for its product; the two differ by fp32 rounding.

The adapters ride along with the block's weights (`AdaptedWeights`, a dict of the slot's views
with `.lora`), so the families' forwards keep one signature; `applied` records which adapters a
forward used, so the executor can refuse a family that skipped one rather than train without
it (runtime/ops.py)."""
import hashlib

import torch
import torch.nn.functional as F


class AdapterDropout:
    """peft's lora_dropout in a training op (Policy.lora_dropout = p): each adapted projection's
    input, in the adapters' dtype, times a mask that keeps an element with probability 1 - p and
    scales it by 1 / (1 - p). The mask is drawn from a generator seeded by `key` (the run's seed,
    the step, the rank, the block, the micro-batch) and the projection's name, so a recompute and
    the backward's forward draw the mask the forward drew, whatever the order of the ops, and a
    resumed run draws the masks the uninterrupted one would."""

    def __init__(self, p: float, key: tuple[int, ...]):
        self.p, self.key = p, key

    def mask(self, module: str, like) -> torch.Tensor:
        """The keep mask of `module`'s input (shaped and typed like it), already scaled by 1 / (1 - p)."""
        seed = int.from_bytes(hashlib.blake2b(repr((*self.key, module)).encode(), digest_size=8).digest(), "little")
        g = torch.Generator(device=like.device).manual_seed(seed & (2**63 - 1))
        return torch.empty_like(like).bernoulli_(1.0 - self.p, generator=g).mul_(1.0 / (1.0 - self.p))

    def __call__(self, module: str, x):
        return x * self.mask(module, x)


class AdaptedWeights(dict):
    """A block's weights by name, and its adapters: lora {module: (A (r, in), B (out, r))},
    scale alpha / r; `applied` fills as the forward adds them; `last_cast` is the latest input's
    copy in the adapters' dtype (the projections that share an input run one after another);
    dropout: an AdapterDropout in a training op (None: no dropout, as in eval)."""

    def __init__(self, weights, lora: dict, scale: float, dropout: AdapterDropout | None = None):
        super().__init__(weights)
        self.lora, self.scale, self.applied, self.dropout = lora, scale, set(), dropout
        self.last_cast: tuple | None = None

    def cast(self, x, dtype):
        """x in `dtype`, made once for consecutive projections of the same input; only the latest
        is held, so a forward without grad keeps one cast alive at a time."""
        if x.dtype == dtype:
            return x
        if self.last_cast is None or self.last_cast[0] is not x:
            self.last_cast = (x, x.to(dtype))
        return self.last_cast[1]


def adapt(w, module: str, x, y):
    """y, the projection `module`'s output for input x, plus its adapter's when w has one."""
    lora = getattr(w, "lora", None)
    if not lora or module not in lora:
        return y
    a, b = lora[module]
    w.applied.add(module)
    xa = w.cast(x, a.dtype)
    if w.dropout is not None:  # its own mask per projection, on the shared cast
        xa = w.dropout(module, xa)
    h = F.linear(xa, a) * w.scale                                         # (..., r)
    return y.add_(F.linear(h, b))                                         # in y's dtype, summed in the adapters'


def linear(x, w, module: str):
    """nn.Linear `module` of the block (its bias when w has one), adapted when w says so."""
    return adapt(w, module, x, F.linear(x, w[f"{module}.weight"], w.get(f"{module}.bias")))


def expert_adapters(w, module: str):
    """The routed-expert stack `module`'s adapters unbound per expert once ((A_e,...), (B_e,...)),
    so the backward assembles each stack's gradient once; None when w has none for it."""
    lora = getattr(w, "lora", None)
    if not lora or module not in lora:
        return None
    w.applied.add(module)
    a, b = lora[module]
    return a.unbind(0), b.unbind(0)


def adapt_rows(w, pairs, e: int, x, y):
    """y, expert e's product for its rows x, plus expert e's adapter (pairs: expert_adapters')."""
    if pairs is None:
        return y
    a, b = pairs[0][e], pairs[1][e]
    h = F.linear(x.to(a.dtype), a) * w.scale                              # (rows, r)
    return y.add_(F.linear(h, b))
