"""build_eval_schedule(model, policy): the loss of one batch under the current weights, as a
Schedule for the same engine and simulator as the training step.

Per micro-batch: the embedding rows gathered on the host and loaded, then per block [its
weights loaded] forward (no autograd), each boundary freed as soon as the next exists, then
HEAD_LOSS (final norm, LM head, chunked loss; forward only). Nothing is kept for a backward,
nothing is offloaded and no optimizer runs. Weight slots follow the training step's rule
(sequence.assign_slots), so a small model stays resident across micro-batches.

Every buffer it names is one the training step of the same (model, policy) declares, with the
same typed fields: the executor runs it on the buffers it already holds, and its device need
never exceeds the step's (the same slots and constants, at most two boundaries and a forward's
temporaries at a time; tests/test_eval_engine.py checks both).
"""
from horizon_sim.schedule.builder import TrainStepBuilder
from horizon_sim.schedule.op import OpKind
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.schedule.sequence import Use, assign_slots
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def eval_sequence(n_layers: int, micro_batches: int) -> list[Use]:
    """The compute ops of an eval: per micro-batch, the blocks' forwards, then the head's loss."""
    out = []
    for m in range(micro_batches):
        out += [Use(OpKind.FORWARD, layer, m) for layer in range(n_layers)]
        out.append(Use(OpKind.HEAD_LOSS, n_layers, m))
    return out


class EvalStepBuilder(TrainStepBuilder):
    def place_optimizer(self, event: str, unit: int | None = None, micro: int = 0) -> None:
        """No update in an eval."""

    def forward(self, use: Use, slot: str) -> None:
        b, u, m = self.bufs, use.unit, use.micro
        self.emit(OpKind.FORWARD, u, m, slot=b.buffers[slot].layer, reads=[b.activation(m, u), slot, *self.lora(u, slot)],
                  writes=[b.activation(m, u + 1)],
                  frees=[b.activation(m, u)], flops=self.fwd_flops[u], hbm_bytes=self.fwd_hbm[u], workspace_bytes=self.fwd_ws[u])

    def head_loss(self, use: Use, slot: str) -> None:
        b, u, m = self.bufs, use.unit, use.micro
        self.emit(OpKind.HEAD_LOSS, u, m, slot=b.buffers[slot].layer, reads=[b.activation(m, u), slot], frees=[b.activation(m, u)],
                  flops=self.model.head_fwd_flops(self.tokens), hbm_bytes=self.head_loss_hbm,
                  workspace_bytes=self.head_loss_ws)

    def build(self) -> Schedule:
        model, p, b = self.model, self.policy, self.bufs
        b.device_constants()
        slots = [b.weight_slot(s) for s in range(p.slots)]
        seq = eval_sequence(model.n_layers, p.micro_batches)
        compute = {OpKind.FORWARD: self.forward, OpKind.HEAD_LOSS: self.head_loss}
        for use, (s, needs_load) in zip(seq, assign_slots(seq, p.slots)):
            if use.kind == OpKind.FORWARD and use.unit == 0:
                self.embed(use.micro)
            if needs_load:
                self.load_weights(use.unit, slots[s], use.micro)
            compute[use.kind](use, slots[s])
        # forward only: a third of the training step's model FLOPs (6N + 12LHT per token)
        flops = model.model_flops_per_token(p.seq, p.context_tokens) * p.tokens / 3
        return self.schedule(slot_bytes=b.slot_bytes, model_flops=flops, purpose="eval")


def build_eval_schedule(model: ModelSpec, policy: Policy, layout: Layout = ONE) -> Schedule:
    """The ops of one eval batch (policy.batch sequences in its micro-batches) of `model`, checked
    (data parallel: one rank's, over the buffers its training step declares; no collective)."""
    return EvalStepBuilder(model, policy, layout).build().check()
