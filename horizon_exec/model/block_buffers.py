"""Each block's tensors that are part of the model but not parameters (ModelFamily.buffers:
DeepSeek-V3's router correction bias, mlp.gate.e_score_correction_bias, E fp32 values a block).

transformers keeps them as persistent buffers: in fp32, loaded and saved with the weights,
never moved by a gradient (V3's bias is tuned by the pretraining's balancing rule, which
fine-tuning does not run; it picks experts only, through a top-k, so no gradient reaches it).
So they are not streamed with the block's weights or given optimizer state: each is held on the
host, in fp32, with a copy resident on the device (a few KB a block), and the engine adds a
block's to the named weights its forward reads (runtime/ops.py). --init-from reads them,
--save-hf and the run's checkpoints write them. The planner does not price them: DeepSeek-V3's
come to 59 KB on each side."""
import torch

from horizon_sim.specs import block
from horizon_sim.specs.families import family


class BlockBuffers:
    def __init__(self, model, backend=None):
        """backend: the run's (its empty() makes the device copies), None: host only."""
        self.m = model
        self.host = {u: {n: torch.zeros(s, dtype=torch.float32) for n, s in block.buffers(model.block_spec(u))}
                     for u in range(model.n_layers)}
        make = backend.empty if backend is not None else torch.empty
        self.device = {u: {n: make(t.shape, torch.float32).copy_(t) for n, t in d.items()} for u, d in self.host.items()}

    def of(self, u: int) -> dict:
        """Block u's buffers on the device, by their names in the block ({} for most families)."""
        return self.device.get(u, {})

    def full_names(self) -> dict[str, tuple[int, str]]:
        """{checkpoint name: (block, name in the block)} of every buffer."""
        prefix = family(self.m.family).layer_prefix
        return {f"{prefix}{u}.{n}": (u, n) for u, d in self.host.items() for n in d}

    def items(self):
        """[(checkpoint name, host fp32 tensor)] in block order."""
        return [(full, self.host[u][n]) for full, (u, n) in self.full_names().items()]

    def set_(self, u: int, name: str, value) -> None:
        """Block u's buffer `name` <- value (any float dtype), on the host and the device (a
        blocking copy: set before the steps that read it, never during one)."""
        self.host[u][name].copy_(value)
        self.device[u][name].copy_(self.host[u][name])
