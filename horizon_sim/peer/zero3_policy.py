"""Zero3Policy: DeepSpeed ZeRO-3 with its parameters and optimizer offloaded to CPU memory, as
users run it today, described by the knobs that change its step. One object drives both the
planner's model of it (zero3_builder.py) and the real DeepSpeed run (ds_config()), so the two
never describe different configurations.

Defaults are DeepSpeed's own (deepspeed/runtime/zero/config.py, 0.19): prefetch bucket 5e7
parameters, max live parameters 1e9, max reuse distance 1e9, reduce bucket 5e8, overlap_comm on
for stage 3, pinned offload buffers.
"""
from dataclasses import asdict, dataclass

from horizon_sim.errors import HorizonError
from horizon_sim.specs.from_dict import spec_from_dict
from horizon_sim.specs.policy import DTYPES, MAX_BATCH, MAX_SEQ, Policy


@dataclass(kw_only=True, frozen=True, slots=True)
class Zero3Policy:
    batch: int = 4
    """Sequences per optimizer step (all micro-batches together)."""
    seq: int = 2048
    micro_batches: int = 1
    """gradient_accumulation_steps."""
    act_ckpt: bool = True
    """Activation checkpointing per decoder layer (transformers' gradient_checkpointing_enable):
    a layer keeps only its input and recomputes its forward in the backward; off, autograd keeps
    every layer's saved tensors on the device until its backward."""
    compute_dtype: str = "bf16"
    """bf16: the bf16 section on (parameters and gradients bf16 on the device); fp32: off."""
    grad_clip: float = 1.0
    """gradient_clipping (0 = off)."""
    prefetch_bucket_params: int = 50_000_000
    """stage3_prefetch_bucket_size: parameters fetched ahead of the module about to run."""
    max_live_params: int = 1_000_000_000
    """stage3_max_live_parameters: parameters kept on the device at once at most."""
    max_reuse_distance_params: int = 1_000_000_000
    """stage3_max_reuse_distance: a fetched parameter used again within this many parameters'
    worth of fetches is not released in between."""
    reduce_bucket_params: int = 500_000_000
    """reduce_bucket_size: gradients gathered on the device before they are reduced and offloaded."""
    overlap_comm: bool = True
    """Offload gradients while the backward goes on (off: the backward waits for each bucket)."""
    pin_memory: bool = True
    """Page-locked host buffers for the offloaded parameters and optimizer state (off: the link's
    pageable rate)."""

    def __post_init__(self):
        for f in ("batch", "seq", "micro_batches", "prefetch_bucket_params", "max_live_params",
                  "max_reuse_distance_params", "reduce_bucket_params"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise HorizonError(f"zero3 policy {f}={v!r} must be a positive integer")
        if self.batch > MAX_BATCH or self.seq > MAX_SEQ:
            raise HorizonError(f"zero3 policy batch={self.batch} seq={self.seq}: allowed up to "
                               f"{MAX_BATCH:,} x {MAX_SEQ:,}")
        if self.batch % self.micro_batches:
            raise HorizonError(f"zero3 policy batch={self.batch} is not divisible by "
                               f"micro_batches={self.micro_batches}")
        if self.compute_dtype not in DTYPES:
            raise HorizonError(f"zero3 policy compute_dtype={self.compute_dtype!r}; allowed: {', '.join(DTYPES)}")
        for f in ("act_ckpt", "overlap_comm", "pin_memory"):
            if not isinstance(getattr(self, f), bool):
                raise HorizonError(f"zero3 policy {f}={getattr(self, f)!r} must be true or false")
        if not isinstance(self.grad_clip, (int, float)) or isinstance(self.grad_clip, bool) or self.grad_clip < 0:
            raise HorizonError(f"zero3 policy grad_clip={self.grad_clip!r} must be a number >= 0 (0 = off)")

    @property
    def micro_batch(self) -> int:
        return self.batch // self.micro_batches

    @classmethod
    def from_dict(cls, d: dict, what: str = "") -> "Zero3Policy":
        """The spec to_dict() wrote (unknown fields: a one-line error naming them)."""
        return spec_from_dict(cls, d, what)

    def to_dict(self) -> dict:
        return asdict(self)

    def horizon_policy(self) -> Policy:
        """The Policy the peer's Schedule carries in its meta, for what the simulator reads from
        one (batch shape, dtypes, clipping): optimizer after backward, fp32 gradients on the
        host, one loss chunk (transformers computes every logit at once), layer checkpoints on
        the device."""
        return Policy(batch=self.batch, seq=self.seq, micro_batches=self.micro_batches, act_ckpt_every=1,
                      act_ckpt_on="device", compute_dtype=self.compute_dtype, grad_dtype=self.compute_dtype,
                      working_copy=self.compute_dtype != "fp32", optimizer="after", grad_clip=float(self.grad_clip),
                      loss_chunk_tokens=self.micro_batch * self.seq)

    def ds_config(self) -> dict:
        """The DeepSpeed config of this policy (deepspeed.initialize(config=...)): ZeRO stage 3,
        parameters and optimizer on the CPU, DeepSpeed's AdamW (DeepSpeedCPUAdam). lr and betas
        are the caller's (`optimizer.params`)."""
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.micro_batches,
            "gradient_clipping": float(self.grad_clip),
            "bf16": {"enabled": self.compute_dtype == "bf16"},
            "zero_optimization": {
                "stage": 3,
                "offload_param": {"device": "cpu", "pin_memory": self.pin_memory},
                "offload_optimizer": {"device": "cpu", "pin_memory": self.pin_memory},
                "stage3_prefetch_bucket_size": self.prefetch_bucket_params,
                "stage3_max_live_parameters": self.max_live_params,
                "stage3_max_reuse_distance": self.max_reuse_distance_params,
                "reduce_bucket_size": self.reduce_bucket_params,
                "overlap_comm": self.overlap_comm,
                "contiguous_gradients": True,
            },
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.0}},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
