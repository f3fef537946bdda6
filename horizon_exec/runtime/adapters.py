"""A run's LoRA adapters (Policy.lora_rank), on its device or, with Policy.adapters_on 'host', in
host RAM (each block's copied into its weight slot's adapter buffer as it loads: views()). The
Schedule's per-block ADAPTERS buffer (3, n) fp32 holds the adapters (each adapted projection's
A (r, in) then B (out, r), in the block's projection order: schedule/work.py adapted) and
AdamW's m and v; ADAPTER_GRADS (n,)
fp32 their gradient, summed over the step's micro-batches by the backward ops and zeroed by the
update. Initialised as peft initialises them (A: kaiming-uniform with a = sqrt(5), i.e. uniform
in +-1/sqrt(in); B: zero, so a fresh adapter changes nothing), from a seeded generator on the
host, whatever the device. The update (ADAPTER_UPDATE; ADAPTER_HOST_UPDATE on the host's cores
when they live there) is the whole step's: the global norm of every adapter gradient, clipping,
then torch's fused AdamW with the trainer's hyperparameters, as torch.optim.AdamW(fused=True)
updates the same tensors."""
import math

import torch

from horizon_exec.optim.adamw import clip_coef
from horizon_sim.schedule import work
from horizon_sim.schedule.op import Holds


class DeviceAdapters:
    def __init__(self, model, policy, buffers):
        self.rank, self.scale = policy.lora_rank, policy.lora_scale
        self.blocks = range(model.n_layers)
        self.modules_of = {u: work.adapted(model.block_spec(u), work.layer_policy(model, policy, u)) for u in self.blocks}
        """Block u's adapted projections (a model with dense blocks before its MoE ones adapts
        each block's own: ModelSpec.block_spec; an expert target may name one layer)."""
        # (3, n) however the buffer is held: the host store's are flat views
        self.state = {u: (t := buffers.find(Holds.ADAPTERS, unit=u)).view(3, t.numel() // 3) for u in self.blocks}
        self.grads = {u: buffers.find(Holds.ADAPTER_GRADS, unit=u) for u in self.blocks}
        device = self.state[0].device if model.n_layers else torch.device("cpu")
        self.step = torch.zeros((), dtype=torch.float32, device=device)
        """AdamW's step counter of every adapter (they are all updated together)."""
        self._views = {u: (self.pairs(self.state[u][0], u), self.pairs(self.grads[u], u)) for u in self.blocks}

    @property
    def modules(self) -> tuple:
        """Every adapted projection, each module once (block order)."""
        seen = {}
        for u in self.blocks:
            for p in self.modules_of[u]:
                seen.setdefault(p.module, p)
        return tuple(seen.values())

    def pairs(self, flat, u: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{module: (A (r, in), B (out, r))} views of block u's flat (n,) adapter tensor; a
        routed-expert stack's: (A (E, r, in), B (E, out, r)), expert e's pair at index e."""
        out, off, r = {}, 0, self.rank
        for p in self.modules_of[u]:
            lead = (p.experts,) if p.experts else ()
            a = flat[off:off + max(1, p.experts) * r * p.in_features].view(*lead, r, p.in_features)
            off += a.numel()
            b = flat[off:off + max(1, p.experts) * p.out_features * r].view(*lead, p.out_features, r)
            off += b.numel()
            out[p.module] = (a, b)
        if off != flat.numel():
            raise ValueError(f"adapters hold {flat.numel()} elements, the targets {off}")
        return out

    def numel(self, u: int) -> int:
        """Block u's adapter parameters (A and B of every adapted projection)."""
        return self.grads[u].numel()

    def views(self, flat, u: int) -> dict:
        """Block u's {module: (A, B)} as views of a device buffer that holds them first (a slot's
        adapter buffer when they live on the host: Policy.adapters_on)."""
        return self.pairs(flat[:self.numel(u)], u)

    def weights(self, u: int) -> dict:
        """Block u's adapters, {module: (A, B)}."""
        return self._views[u][0]

    def grad_pairs(self, u: int) -> dict:
        """Block u's adapter gradient sums, {module: (dA, dB)}."""
        return self._views[u][1]

    @torch.no_grad()
    def init(self, seed: int) -> None:
        """peft's initialisation, drawn on the host from `seed`: A uniform in +-1/sqrt(in)
        (kaiming_uniform_ with a = sqrt(5)), B zero; moments, gradients and the step zero."""
        gen = torch.Generator().manual_seed(seed)
        for u in self.blocks:
            self.state[u].zero_()
            self.grads[u].zero_()
            for a, _ in self.weights(u).values():
                bound = 1.0 / math.sqrt(a.shape[-1])  # (an expert stack's A as peft's one (E r, in) Linear)
                a.copy_(torch.empty(a.shape).uniform_(-bound, bound, generator=gen))
        self.step.zero_()

    def sq_norm(self) -> float:
        """The squared global norm of every adapter gradient (one device -> host sync)."""
        total = sum(g.double().square().sum() for g in self.grads.values())
        return float(total) if self.grads else 0.0

    @torch.no_grad()
    def update(self, adamw, lr: float, grad_clip: float, total_sq: float) -> None:
        """AdamW on every adapter with its gradient (clipped by the global norm sqrt(total_sq)
        when clipping is on), the step counter once, then the gradients zeroed."""
        coef = clip_coef(grad_clip, math.sqrt(total_sq)) if grad_clip > 0 else 1.0
        scale = None if coef >= 1.0 else torch.tensor(1.0 / coef, dtype=torch.float32, device=self.step.device)
        self.step += 1
        blocks = list(self.blocks)
        torch._fused_adamw_([self.state[u][0] for u in blocks], [self.grads[u] for u in blocks],
                            [self.state[u][1] for u in blocks], [self.state[u][2] for u in blocks], [],
                            [self.step] * len(blocks), lr=lr, beta1=adamw.betas[0],
                            beta2=adamw.betas[1], weight_decay=adamw.weight_decay, eps=adamw.eps, amsgrad=False,
                            maximize=False, grad_scale=scale)
        for g in self.grads.values():
            g.zero_()
