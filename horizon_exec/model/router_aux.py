"""The router load-balancing loss (Switch Transformer eq. 4-6, transformers'
load_balancing_loss_func) in a streaming engine, where no op ever holds every layer's router
logits at once.

transformers, for one forward call of N tokens through L MoE layers: each layer's router
probabilities (N, E) (softmax of its logits), C_e = top-k picks of expert e and P_e = the sum of
expert e's probabilities, both over the L N rows of every layer, and
    aux = E * sum_e (C_e / (L N)) * (P_e / (L N)),    loss = CE + coef * aux.
Horizon passes no attention_mask (it packs documents and pads nothing), so every row counts, as
in transformers without one.

C is a count: no gradient flows through it, so d aux / d P_l,e = E C_e / (L N)^2 for layer l's
own sum P_l. That needs the counts of EVERY layer, which are known once the forward has passed
all layers and before any backward runs (a micro-batch's HEAD follows its last layer's forward
in both micro-batch orders). So, per micro-batch:
  - each layer's FORWARD (a kept layer's too) adds its counts and its P_l, detached (add);
  - the HEAD closes the sums: the micro-batch's aux (close);
  - each layer's backward (recomputing the layer from its checkpoint, or from a kept graph)
    differentiates the layer's P_l against the constant grad(): as if the loss held the
    surrogate coef * share * E * sum_e C_e P_l,e / (L N)^2, whose gradient is the true one.
RECOMPUTE adds nothing: the forward already counted the layer.

Micro-batches and ranks: transformers computes aux per forward call. Horizon computes it per
micro-batch (one forward call's rows), and the step's aux is the mean over the step's
micro-batches of every rank (share 1 / (micro_batches * ranks) each): with one micro-batch on
one rank it is transformers' number for the whole batch, and with several it is what
transformers gives averaged over forward calls of those rows. The step's loss is the token-mean
CE of the whole step + coef * that mean.
"""
import torch

from horizon_sim.specs.model import ModelSpec


class RouterStats:
    """What one block's router saw of one micro-batch (moe_mlp fills it): prob_sum (E,) fp32,
    each expert's probability summed over the tokens (tracked by autograd when the block runs
    with grad), and counts (E,) int64, the top-k picks of each expert."""
    __slots__ = ("prob_sum", "counts")

    def __init__(self):
        self.prob_sum = self.counts = None

    def seen(self, probs, counts) -> None:
        """probs (N, E) fp32, counts (E,): called once by the block's MoE MLP."""
        self.prob_sum = probs.sum(dim=0)
        self.counts = counts


class RouterAux:
    """One step's load-balancing sums, per micro-batch, on the device (two (E,) fp32 each), and
    each micro-batch's aux once its HEAD closes it. share: each micro-batch's weight in the
    step's aux (1 / (micro_batches * ranks)); coef: router_aux_loss_coef."""

    def __init__(self, m: ModelSpec, micro_batches: int, micro_tokens: int, share: float):
        self.n_experts, self.coef, self.share = m.n_experts, float(m.router_aux_loss_coef), share
        self.rows = m.n_layers * micro_tokens  # L N: every block is an MoE block (specs/moe.py)
        self.counts = [None] * micro_batches   # C, fp32 (exact below 2^24 picks, like transformers' histc)
        self.probs = [None] * micro_batches    # P
        self.parts: list = [None] * micro_batches
        """Each micro-batch's aux times its share (0-d fp32), set by close()."""

    def add(self, micro: int, stats: RouterStats) -> None:
        """A layer's FORWARD: its counts and probability sums into the micro-batch's."""
        c, p = stats.counts.to(torch.float32), stats.prob_sum.detach()
        if self.counts[micro] is None:
            self.counts[micro], self.probs[micro] = c, p.clone()
        else:
            self.counts[micro] += c
            self.probs[micro] += p

    def close(self, micro: int) -> None:
        """The micro-batch's HEAD (every layer has run forward): its aux, times its share."""
        tokens_per_expert = self.counts[micro] / self.rows
        router_prob_per_expert = self.probs[micro] / self.rows
        self.parts[micro] = self.n_experts * torch.sum(tokens_per_expert * router_prob_per_expert) * self.share

    def grad(self, micro: int):
        """d(step loss) / d(a layer's prob_sum) (E,) for this micro-batch: constant across its
        layers (the counts of all of them)."""
        return self.counts[micro] * (self.coef * self.share * self.n_experts / self.rows ** 2)

    def value(self) -> float:
        """The step's aux (this rank's share of it): the micro-batches' aux times their shares."""
        return float(sum(p.item() for p in self.parts if p is not None))
