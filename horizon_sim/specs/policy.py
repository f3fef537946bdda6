"""Policy: how a step is run: batch shape, checkpointing, buffering, precision, optimizer overlap."""
import math
from dataclasses import dataclass, asdict, replace
from functools import lru_cache

from horizon_sim.errors import HorizonError
from horizon_sim.specs.from_dict import spec_from_dict
from horizon_sim.specs.quant import QUANT_FORMATS

OPTIMIZER_MODES = ("after", "backward", "pipelined")
DISK_TIERS = ("none", "moments", "moments+low")
MASTER_ROUNDINGS = ("nearest", "stochastic")
CKPT_PLACES = ("device", "host")
DTYPES = ("fp32", "bf16")
MASTER_CHOICES = ("fp32", "split", "bf16")
"""How the master weights are kept (Policy.from_choices' `master`): an fp32 or a bf16 master, or
'split': the exact fp32 master as its bf16 working copy + a 16-bit low half (split_master).
None (no choice): 'split' where it can be (split_possible), else 'fp32'."""
ATTENTION = ("flash", "eager")
MB_ORDERS = ("micro", "layer")
LOSS_KERNELS = ("torch", "fused")
OBJECTIVES = ("sft", "dpo")
"""What a step minimises (Policy.objective): the token cross-entropy, or DPO on preference pairs."""
DPO_LOSSES = ("sigmoid", "ipo", "robust")
"""Policy.dpo_loss, as TRL's DPOTrainer names them: DPO's -log sigmoid(beta d), IPO's squared
hinge on the length-normalised margin, and robust DPO's label-smoothed sigmoid."""
"""How the head computes the loss of a chunk of logits and its gradient (Policy.loss_kernel)."""
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
LORA_ALL = "all-linear"
"""Policy.lora_targets's value for every projection of the blocks (peft's 'all-linear': the LM
head, the embedding and the routed experts' stacked weights left out)."""
EXPERT_TARGET = "experts"
"""A lora_targets name whose next-to-last part is this names a routed-expert stack by its
parameter path ('mlp.experts.gate_up_proj', or its tail 'experts.gate_up_proj'), as peft's
target_parameters takes it: one adapter per expert (model/adapters.py). With a layer index
before it ('7.mlp.experts.gate_up_proj', the gpt-oss recipes' way), that layer's stack alone.
('mlp.shared_experts.gate_proj' is a Linear module.)"""
_LORA_ALPHA = 8.0  # Policy.lora_alpha's default (peft's)
HOST_UPDATE_FIELDS = ("optimizer", "master_dtype", "split_master", "master_rounding", "states_dtype", "grad_dtype",
                      "working_copy", "disk_tier", "max_host_grads")
"""Policy fields of the full fine-tuning's host update (the master, its moments and gradients,
their update): a frozen base (lora_rank) has none, and their flags are refused with adapters."""
ADAPTER_PLACES = ("device", "host")
"""Where a run's adapters, their gradients and AdamW state live (Policy.adapters_on)."""
MAX_LORA_RANK = 2**16
"""The largest adapter rank taken: above the widest projection of any preset (Llama-3.1-405B's
53,248-wide MLP), where an adapter would hold more than the weight it adapts."""
MAX_BATCH = 2**20
"""Sequences per step. The largest global batches published are ~2,000-4,000 sequences
(Llama 3: 16M tokens of 4,096-8,192); 2^20 is 256x that."""
MAX_SEQ = 2**24
"""Tokens per sequence. The longest contexts trained today are ~1M tokens (Qwen2.5-1M), 10M
advertised (Llama 4 Scout); 2^24 is 16.7M. With MAX_BATCH it keeps every FLOP count a finite
float (attention grows with seq^2)."""
KEEP_ALL = -1
"""Policy.keep_last's value for 'every layer keeps its activations' (the CLI's `all`): a policy
is independent of the model's depth, so 'all' cannot be a number of layers."""
MAX_SLOTS = 513
"""Device weight slots: one per streamed unit (blocks and the head) of the deepest model the
planner takes (schedule/limits.py MAX_LAYERS = 512); more are never used."""


@dataclass(kw_only=True, frozen=True, slots=True)
class Policy:
    batch: int = 4
    """Sequences per optimizer step (all micro-batches together)."""
    seq: int = 2048
    """Tokens per sequence."""
    micro_batches: int = 1
    """Micro-batches per step, in the order mb_order says; gradients accumulate on the host
    (mb_order 'layer': on the device)."""
    act_ckpt_every: int = 1
    """K: keep a layer-boundary activation every K blocks; backward recomputes the K-1 between."""
    slots: int = 2
    """Device weight buffers (>= 2: one computes while the next loads)."""
    act_ckpt_on: str = "host"
    """Where boundary checkpoints live between forward and backward: 'device' or 'host'.
    'host' keeps device memory independent of depth; 'device' saves link traffic."""
    compute_dtype: str = "bf16"
    """Dtype of device weights and activations ('fp32' for exactness checks)."""
    master_dtype: str | None = None
    """Host master weights: 'fp32', or 'bf16': no fp32 master (the seed code's policy): an
    update smaller than half a bf16 ulp of its weight is lost. None (not given): an fp32 master,
    split (split_master) wherever split_possible says it can be; a Policy always holds the
    resolved 'fp32' or 'bf16', so what it records (to_dict) is explicit."""
    master_rounding: str = "nearest"
    """A bf16 master: 'nearest' (even) loses every update below half a bf16 ulp of its weight;
    'stochastic' rounds up with probability (the residual / one ulp), so the stored weight is
    the updated one in expectation and small updates survive on average (reproducible: the
    draws are a hash of the seed, the unit, the step and the element)."""
    split_master: bool | None = None
    """Keep the exact fp32 master as two 16-bit halves: the high half (its bf16 rounding to
    nearest, ties away from zero) is the working copy the loads stream, the low half its other
    16 bits. The fp32 master and its bf16 copy then take 4 bytes per parameter, not 6, and the
    optimizer moves 26 bytes per parameter instead of 28; the master is updated bit for bit
    as an fp32 one. Needs master_dtype='fp32', compute_dtype='bf16' and the working copy.
    None (not given): True when master_dtype is not given either and split_possible, else
    False (an explicit master_dtype='fp32' is the whole fp32 master, as older files meant it:
    they all name master_dtype, and the ones from before the split do not name this field)."""
    states_dtype: str = "fp32"
    """Adam moments on the host."""
    grad_dtype: str = "bf16"
    """Gradients as they cross the device-to-host link."""
    working_copy: bool = True
    """Keep a persistent host copy of the weights in compute_dtype, refreshed by the optimizer,
    so loads move compute_dtype bytes. Off: loads move master bytes and cast on the device."""
    optimizer: str = "pipelined"
    """'after': all layers after backward (as the published code); 'backward': each layer as
    its gradient arrives (no exact global clipping); 'pipelined': each layer just before the
    next step's forward needs it, with the exact global norm of the finished backward."""
    grad_clip: float = 1.0
    """Global-norm clipping threshold; 0 turns clipping off."""
    attention: str = "flash"
    """Attention kernel the activation model assumes: 'flash' (no T×T term) or 'eager'."""
    loss_chunk_tokens: int = 1024
    """The LM head and loss run over this many tokens at a time, so full logits never exist."""
    loss_kernel: str = "torch"
    """The loss of a chunk of logits and its gradient: 'torch': whole-tensor torch kernels on
    an fp32 copy of the chunk (any device; the chunk's peak holds c x V x (compute dtype + 8)
    bytes); 'fused': one native pass per row, the gradient written over the logits (the CPU
    backend; c x V x compute-dtype bytes, and the loss's elementwise time ~4x smaller).
    The commands default to 'fused' for the CPU backend, 'torch' for GPUs."""
    doc_masks: bool = False
    """Document-aware attention for packed data: a token attends only within its own document
    and positions restart at each document (transformers' packed sequences). The attention
    kernel then runs under an explicit mask: every T x T score is computed (no causal tile
    skipping), plus a (micro_batch, T, T) bool mask per block call."""
    doc_tokens: int = 0
    """Mean document length in tokens, for model FLOPs (MFU) under doc_masks: a token attends
    to at most its document. 0 = seq (documents as long as the sequence)."""
    disk_tier: str = "none"
    """'moments': the Adam moments live in a file on local disk, not in RAM; the disk lane reads
    a unit's moments into a RAM stage ahead of its update and writes them back after (two
    stages: one being updated while the next is read and the last written). RAM then holds the
    master (4 B/param split, with the working copy) and two units' moments; the disk holds the
    moments (8 B/param) and moves 16 B/param a step. 'moments+low' (a split master): its low
    halves too, so RAM holds 2 B/param of master (the working copy) and the disk 10."""
    max_host_grads: int = 0
    """optimizer='backward': at most this many units' gradients wait on the host for the CPU
    optimizer at once; a unit's offload waits until the oldest has been applied (0 = no bound:
    a slow optimizer lets them pile up). The embedding's own gradient is not counted."""
    mb_order: str = "micro"
    """How the micro-batches pass the streamed units. 'micro': each micro-batch runs the whole
    forward and backward in turn, so every unit's weights cross the link once per micro-batch
    each way. 'layer': while a unit's weights are resident every micro-batch passes it (the
    forward unit by unit, each for every micro-batch; the backward block of K by block, each
    block for every micro-batch), so weights cross the link twice per step whatever the
    micro-batches, and a unit's gradients are summed on the device (fp32) and offloaded once.
    The price is device memory: every micro-batch's boundaries are live at once."""
    keep_last: int = 0
    """The last `keep_last` layers of the forward (the ones backward needs first) keep what
    autograd saves in their forward on the device, and their backward runs from it: no
    recompute, at the price of those saved tensors' bytes per layer and micro-batch from the
    layer's forward to its backward. 0: every layer recomputes (from its K-block's
    checkpoint); KEEP_ALL (-1): every layer keeps. Layers that recompute form the K-blocks
    of the layers before the kept ones."""
    lora_rank: int = 0
    """0: full fine-tuning. R > 0: LoRA adapters of rank R on a frozen base (docs/adapters.md):
    the base is kept on the host in compute_dtype only (no master, no moments, no host
    gradients) and streams as today; the adapters, their gradients and their AdamW moments
    (fp32) stay on the device, updated there after the backward (optimizer 'after'); the
    backward computes input gradients, not the base's weight gradients. The master, moments,
    gradient-dtype and disk-tier fields do not apply."""
    lora_targets: str = LORA_ALL
    """With lora_rank: the projections that get an adapter, comma-separated: Linear modules by
    their names as peft's target_modules takes them ('q_proj,v_proj'), or 'all-linear' (every
    Linear projection of the blocks); and routed-expert stacks by their parameter path as peft's
    target_parameters takes it ('mlp.experts.gate_up_proj', 'experts.down_proj'): an adapter per
    expert. 'all-linear' combines with expert stacks ('all-linear,experts.gate_up_proj'). A
    name with a layer index before the path in the block ('7.self_attn.q_proj',
    '7.mlp.experts.down_proj') adapts that layer's alone, as peft matches such names (and as
    its layers_to_transform picks layers)."""
    lora_alpha: float = _LORA_ALPHA
    """With lora_rank: the adapters' output is scaled by lora_alpha / lora_rank (peft's
    lora_alpha, and its default). The planner's figures do not depend on it."""
    lora_dropout: float = 0.0
    """With lora_rank: the probability that an element of an adapter's input is zeroed in training
    (the rest scaled by 1 / (1 - p)), as peft's lora_dropout: a mask per adapted projection, per
    micro-batch and step, drawn again the same in a recompute (model/adapters.py). 0: none."""
    adapters_on: str = "device"
    """With lora_rank: where the adapters, their gradients and their AdamW moments live (fp32, 16
    bytes an adapter parameter). 'device': there for the whole run, updated there. 'host': in host
    RAM; each block's adapters cross the link with its weights into a slot beside them, each
    backward's adapter gradient crosses back and is summed on the host, and the update runs on
    the host's cores: for adapters the device cannot hold beside the streamed blocks."""
    objective: str = "sft"
    """'sft': the token cross-entropy. 'dpo': Direct Preference Optimisation (docs/adapters.md): the
    batch is preference pairs, each a chosen row then a rejected row, whose labels mark the
    completion's tokens; the loss compares each row's completion log-probability with the
    reference model's, computed in the same step by a forward pass over the batch before the
    training pass (REF_FORWARD ops). The reference: with adapters, the base without them; in full
    fine-tuning, a copy of the weights the run started from, kept on the host in the compute
    dtype (2 bytes a parameter more)."""
    dpo_beta: float = 0.1
    """DPO's beta (TRL's default): how far the policy may move from the reference."""
    dpo_loss: str = "sigmoid"
    """DPO_LOSSES: sigmoid, ipo or robust (TRL's loss_type)."""
    dpo_label_smoothing: float = 0.0
    """robust: the assumed fraction of flipped preference labels, in [0, 0.5) (TRL's label_smoothing)."""
    base_quant: str = "none"
    """With lora_rank: how the frozen base's blocks are stored on the host and cross the link
    (specs/quant.py): 'none' in the compute dtype; 'nf4' QLoRA's 4-bit NormalFloat with double
    quantization (~0.52 bytes a quantized parameter); 'int8' 8 bits a parameter with a scale a
    row. The device dequantizes each block into its slot as it loads; the embedding, the head,
    norms, biases and an MoE router stay in the compute dtype."""

    def __post_init__(self):
        self._resolve_master()
        for f in ("batch", "seq", "micro_batches", "act_ckpt_every", "loss_chunk_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise HorizonError(f"policy {f}={v!r} must be a positive integer")
        if not isinstance(self.slots, int) or isinstance(self.slots, bool) or self.slots < 2:
            raise HorizonError(f"policy slots={self.slots!r} must be an integer >= 2 (one computes while one loads)")
        for f, low, limit, why in (
                ("batch", 1, MAX_BATCH, "the largest published global batches are ~4,000 sequences"),
                ("seq", 1, MAX_SEQ, "the longest trained contexts are ~1M-10M tokens"),
                ("slots", 2, MAX_SLOTS, "one per streamed unit of the deepest model the planner takes")):
            if getattr(self, f) > limit:
                raise HorizonError(f"policy {f}={getattr(self, f)} is beyond what the planner takes "
                                   f"({why}); allowed: {low}..{limit:,}")
        if self.batch % self.micro_batches:
            raise HorizonError(
                f"policy batch={self.batch} is not divisible by micro_batches={self.micro_batches}")
        for f, allowed in (("act_ckpt_on", CKPT_PLACES), ("optimizer", OPTIMIZER_MODES),
                           ("attention", ATTENTION), ("compute_dtype", DTYPES), ("disk_tier", DISK_TIERS),
                           ("master_rounding", MASTER_ROUNDINGS), ("mb_order", MB_ORDERS), ("loss_kernel", LOSS_KERNELS),
                           ("master_dtype", DTYPES), ("states_dtype", DTYPES), ("grad_dtype", DTYPES)):
            if getattr(self, f) not in allowed:
                raise HorizonError(f"policy {f}={getattr(self, f)!r}; allowed: {', '.join(allowed)}")
        if not isinstance(self.keep_last, int) or isinstance(self.keep_last, bool) or self.keep_last < KEEP_ALL:
            raise HorizonError(f"policy keep_last={self.keep_last!r} must be a number of layers >= 0, or "
                               f"{KEEP_ALL} (all)")
        if not isinstance(self.doc_tokens, int) or isinstance(self.doc_tokens, bool) or self.doc_tokens < 0:
            raise HorizonError(f"policy doc_tokens={self.doc_tokens!r} must be an integer >= 0 (0 = seq)")
        if not isinstance(self.max_host_grads, int) or isinstance(self.max_host_grads, bool) or self.max_host_grads < 0:
            raise HorizonError(f"policy max_host_grads={self.max_host_grads!r} must be an integer >= 0 (0 = no bound)")
        if self.max_host_grads and (self.optimizer != "backward" or self.micro_batches != 1):
            raise HorizonError(
                f"policy max_host_grads={self.max_host_grads} bounds the gradients waiting for optimizer='backward' "
                f"with one micro-batch (here optimizer={self.optimizer!r}, micro_batches={self.micro_batches}): "
                "the other modes keep every gradient until the step's end by design")
        self._check_adapters()
        self._check_objective()
        if self.doc_tokens and not self.doc_masks:
            raise HorizonError(f"policy doc_tokens={self.doc_tokens} prices document masks; set doc_masks too")
        if (not isinstance(self.grad_clip, (int, float)) or isinstance(self.grad_clip, bool)
                or not math.isfinite(self.grad_clip) or self.grad_clip < 0):
            raise HorizonError(f"policy grad_clip={self.grad_clip!r} must be a finite number >= 0 (0 = off)")
        if self.optimizer == "backward" and self.grad_clip > 0:
            raise HorizonError(
                "policy optimizer='backward' updates each layer before the global gradient norm "
                "is known, so it cannot clip exactly: use grad_clip=0 or optimizer='pipelined'")
        if self.disk_tier == "moments+low" and not self.split_master:
            raise HorizonError(f"policy disk_tier='moments+low' puts a split master's low halves on disk; here the "
                               f"master is {self.master_choice}: use the split master (--master-dtype split; the "
                               "default with bf16 compute and the working copy), or disk_tier='moments'")
        if self.master_rounding == "stochastic" and self.master_dtype != "bf16":
            raise HorizonError(f"policy master_rounding='stochastic' rounds a bf16 master; here master_dtype="
                               f"{self.master_dtype} (an fp32 master keeps every update: use --master-dtype bf16)")
        if not isinstance(self.split_master, bool):
            raise HorizonError(f"policy split_master={self.split_master!r} must be True or False")
        if self.split_master and not (self.master_dtype == "fp32" and split_possible(self.compute_dtype,
                                                                                      self.working_copy)):
            raise HorizonError(  # the hint: a copy of a default policy (dataclasses.replace) keeps its split
                f"policy split_master=True splits an fp32 master into its bf16 working copy and a low half; here "
                f"master_dtype={self.master_dtype}, compute_dtype={self.compute_dtype}, working_copy={self.working_copy} "
                "(it needs fp32, bf16, True; the default master is split where it can be: for the whole fp32 "
                "master set split_master=False, --master-dtype fp32)")
        if self.working_copy and self.compute_dtype == self.master_dtype:
            raise HorizonError(
                f"policy working_copy=True duplicates the {self.master_dtype} master weights "
                f"(compute_dtype is also {self.compute_dtype}): turn working_copy off")
        if DTYPE_BYTES[self.grad_dtype] > DTYPE_BYTES[self.compute_dtype]:
            raise HorizonError(
                f"policy grad_dtype={self.grad_dtype} is wider than compute_dtype="
                f"{self.compute_dtype}: gradients cannot gain precision on the way out")

    def _check_adapters(self) -> None:
        """lora_rank and lora_targets well formed, and with adapters none of the full
        fine-tuning's host-update options (they have nothing to act on)."""
        r = self.lora_rank
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= MAX_LORA_RANK:
            raise HorizonError(f"policy lora_rank={r!r} must be an integer 0..{MAX_LORA_RANK:,} (0: full fine-tuning)")
        t = self.lora_targets
        if not isinstance(t, str) or not t.strip() or any(not n.strip() for n in t.split(",")):
            raise HorizonError(f"policy lora_targets={t!r} must be '{LORA_ALL}' or module names separated by commas "
                               "(e.g. 'q_proj,v_proj')")
        a = self.lora_alpha
        if not isinstance(a, (int, float)) or isinstance(a, bool) or not math.isfinite(a) or a <= 0:
            raise HorizonError(f"policy lora_alpha={a!r} must be a positive number (the adapters' scale is alpha / rank)")
        if self.base_quant not in QUANT_FORMATS:
            raise HorizonError(f"policy base_quant={self.base_quant!r}; allowed: {', '.join(QUANT_FORMATS)}")
        d = self.lora_dropout
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not math.isfinite(d) or not 0 <= d < 1:
            raise HorizonError(f"policy lora_dropout={d!r} must be a probability in [0, 1) (peft's lora_dropout)")
        if self.adapters_on not in ADAPTER_PLACES:
            raise HorizonError(f"policy adapters_on={self.adapters_on!r}; allowed: {', '.join(ADAPTER_PLACES)}")
        if not r:
            if self.adapters_on != "device":
                raise HorizonError(f"policy adapters_on={self.adapters_on!r} places adapters; give lora_rank too "
                                   "(--lora-rank R)")
            if d:
                raise HorizonError(f"policy lora_dropout={d!r} drops adapters' inputs; give lora_rank too (--lora-rank R)")
            if self.base_quant != "none":
                raise HorizonError(f"policy base_quant={self.base_quant!r} quantizes a frozen base; give lora_rank too "
                                   "(--lora-rank R): a base that trains needs its full-precision master")
            if a != _LORA_ALPHA:
                raise HorizonError(f"policy lora_alpha={a!r} scales adapters; give lora_rank too (--lora-rank R)")
            if t != LORA_ALL:
                raise HorizonError(f"policy lora_targets={t!r} names adapters; give lora_rank too (--lora-rank R)")
            return
        for f, off in (("optimizer", "after"), ("disk_tier", "none"), ("max_host_grads", 0),
                       ("master_rounding", "nearest")):  # (of HOST_UPDATE_FIELDS, those with a value that acts)
            if getattr(self, f) != off:
                raise HorizonError(
                    f"policy {f}={getattr(self, f)!r} does not apply with adapters (lora_rank={r}): the frozen base "
                    f"has no master, moments or host update, and the adapters update on the device after the "
                    f"backward; use {f}={off!r}")

    def _check_objective(self) -> None:
        """The objective and DPO's fields well formed; DPO on adapters, with whole pairs per micro-batch."""
        if self.objective not in OBJECTIVES:
            raise HorizonError(f"policy objective={self.objective!r}; allowed: {', '.join(OBJECTIVES)}")
        b, ls = self.dpo_beta, self.dpo_label_smoothing
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not math.isfinite(b) or b <= 0:
            raise HorizonError(f"policy dpo_beta={b!r} must be a positive number")
        if self.dpo_loss not in DPO_LOSSES:
            raise HorizonError(f"policy dpo_loss={self.dpo_loss!r}; allowed: {', '.join(DPO_LOSSES)}")
        if not isinstance(ls, (int, float)) or isinstance(ls, bool) or not 0 <= ls < 0.5:
            raise HorizonError(f"policy dpo_label_smoothing={ls!r} must be in [0, 0.5)")
        if self.objective != "dpo":
            for f, off in (("dpo_beta", 0.1), ("dpo_loss", "sigmoid"), ("dpo_label_smoothing", 0.0)):
                if getattr(self, f) != off:
                    raise HorizonError(f"policy {f}={getattr(self, f)!r} sets DPO; give objective='dpo' too "
                                       "(--objective dpo)")
            return
        if ls and self.dpo_loss != "robust":
            raise HorizonError(f"policy dpo_label_smoothing={ls} smooths the robust loss (TRL's); here dpo_loss="
                               f"{self.dpo_loss!r}: use dpo_loss='robust' or no smoothing")
        if self.doc_masks:
            raise HorizonError("policy objective='dpo' has one prompt and completion a row, nothing packed: drop "
                               "doc_masks (--doc-masks)")
        if self.micro_batch % 2:
            raise HorizonError(f"policy objective='dpo' takes pairs (a chosen and a rejected row) whole in each "
                               f"micro-batch; here {self.micro_batch} row(s) a micro-batch: use an even number")

    @property
    def lora_scale(self) -> float:
        """What the adapters' output is multiplied by: lora_alpha / lora_rank (peft's scaling)."""
        return self.lora_alpha / self.lora_rank

    @property
    def quantized_base(self) -> bool:
        """The frozen base's blocks are stored quantized (base_quant nf4 or int8)."""
        return self.base_quant != "none"

    @property
    def objective_text(self) -> str:
        """The objective in words for the policy lines of plan and train ('' for the token loss)."""
        if self.objective != "dpo":
            return ""
        smooth = f", label smoothing {self.dpo_label_smoothing:g}" if self.dpo_label_smoothing else ""
        ref = ("the base without the adapters" if self.adapters else
               f"a copy of the starting weights in host RAM ({self.compute_dtype})")
        return (f"DPO ({self.dpo_loss} loss, beta {self.dpo_beta:g}{smooth}) on preference pairs, against {ref} "
                "(a reference pass before each step's)")

    @property
    def base_form(self) -> str:
        """How a frozen base is held on the host, in words (the policy lines of plan and train)."""
        return (f"{self.base_quant} blocks (the embedding and head in {self.compute_dtype})" if self.quantized_base
                else self.compute_dtype)

    @property
    def adapters(self) -> bool:
        """LoRA adapters on a frozen base (lora_rank > 0)."""
        return self.lora_rank > 0

    def target_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """lora_targets split: (Linear names, 'all-linear' among them; routed-expert stack paths)."""
        names = [n.strip() for n in self.lora_targets.split(",")]
        return tuple(n for n in names if not _is_stack(n)), tuple(n for n in names if _is_stack(n))

    def at_layer(self, layer: int, prefix: str) -> "Policy":
        """The policy as block `layer` sees it (its parameters named under `prefix`, e.g.
        'model.layers.'): a target that names this layer ('7.mlp.experts.down_proj',
        '7.self_attn.q_proj') loses its layer; one naming another layer stays as it is and
        matches nothing here."""
        return _at_layer(self, layer, prefix) if self.adapters and any(c.isdigit() for c in self.lora_targets) else self

    def adapter_modules(self, modules: tuple[str, ...], stacks: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Which of a block's Linear projection modules (transformers' paths, 'self_attn.q_proj')
        and routed-expert stacks ('mlp.experts.gate_up_proj') get an adapter: every Linear one
        under 'all-linear', else those whose path ends with a target ('q_proj',
        'self_attn.q_proj', as peft's target_modules list matches); a stack whose path ends with
        an expert target without a layer (at_layer resolves names with a layer). Names are
        checked against the whole model (check_targets)."""
        linear, experts = self.target_names()
        chosen = modules if LORA_ALL in linear else tuple(m for m in modules if any(_path_ends(m, t) for t in linear))
        own = [t for t in experts if not _has_layer(t)]
        return chosen + tuple(s for s in stacks if any(_path_ends(s, t) for t in own))

    def check_targets(self, layers: list[tuple[tuple[str, ...], tuple[str, ...]]], prefix: str) -> None:
        """HorizonError naming each lora_targets name that no block of the model has (layers:
        each block's (Linear projection modules, routed-expert stacks), its parameters named
        under `prefix`), and what is allowed; and dropout with expert targets (peft has none)."""
        linear, experts = self.target_names()
        last = {m.rsplit(".", 1)[-1] for modules, _ in layers for m in modules}
        stacks = sorted({s for _, ss in layers for s in ss})
        unknown = []
        for kind, names in ((0, [n for n in linear if n != LORA_ALL]), (1, experts)):
            have = {m for layer in layers for m in layer[kind]}
            for n in names:
                q = _layer_of(n, prefix)
                if q is None:
                    hit = not _has_layer(n) and any(_path_ends(m, n) for m in have)
                else:  # (peft: the whole path after the layer, '7.self_attn.q_proj', not '7.q_proj')
                    hit = q[0] < len(layers) and q[1] in layers[q[0]][kind]
                if not hit:
                    unknown.append(n)
        if unknown:
            allowed = sorted(last) + stacks + [LORA_ALL]
            examples = ([f"'0.{layers[0][0][0]}'"] if layers and layers[0][0] else []) + \
                ([f"'{_first_stack(layers)}'"] if stacks else [])
            one = " or ".join(examples)
            raise HorizonError(f"policy lora_targets names {', '.join(map(repr, unknown))}, which this model's blocks do "
                               f"not have; allowed: {', '.join(allowed)}" +
                               (f" (a projection of one layer: '<layer>.<path in the block>', e.g. {one})" if one else ""))
        if experts and self.lora_dropout:
            raise HorizonError(f"policy lora_dropout={self.lora_dropout!r} with routed-expert targets "
                               f"({', '.join(experts)}): peft's LoRA on expert stacks has no dropout; use 0")

    def _resolve_master(self) -> None:
        """The master's defaults made explicit (master_dtype, split_master: None -> values)."""
        if self.split_master is None:  # frozen: the one place a field is set after __init__
            object.__setattr__(self, "split_master", self.master_dtype is None and not self.lora_rank
                               and split_possible(self.compute_dtype, self.working_copy))
        if self.master_dtype is None:
            object.__setattr__(self, "master_dtype", "fp32")

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch."""
        return self.batch // self.micro_batches

    def kept_layers(self, n_layers: int) -> int:
        """How many of a model's n_layers keep their activations (keep_last, KEEP_ALL: all)."""
        return n_layers if self.keep_last == KEEP_ALL else min(self.keep_last, n_layers)

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.batch * self.seq

    @property
    def context_tokens(self) -> int:
        """What a query can attend to at most under the policy's data (model FLOPs): the mean
        document under doc_masks, else the sequence."""
        return min(self.doc_tokens or self.seq, self.seq) if self.doc_masks else self.seq

    @property
    def clip(self) -> bool:
        return self.grad_clip > 0

    @property
    def master_bytes(self) -> int:
        """Host RAM bytes per parameter of the master beyond the working copy (a split master:
        its low half, unless it is on disk; the high half is the copy)."""
        if self.split_master:
            return 0 if self.disk_tier == "moments+low" else 2
        return DTYPE_BYTES[self.master_dtype]

    @property
    def disk_bytes_per_param(self) -> int:
        """Bytes per parameter the disk tier keeps on disk (0: none)."""
        return {"none": 0, "moments": 2 * DTYPE_BYTES[self.states_dtype],
                "moments+low": 2 * DTYPE_BYTES[self.states_dtype] + 2}[self.disk_tier]

    @classmethod
    def from_dict(cls, d: dict, what: str = "") -> "Policy":
        """The spec to_dict() wrote (unknown fields: a one-line error naming them)."""
        return spec_from_dict(cls, d, what)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_choices(cls, *, master: str | None = None, grad_clip: float | None = None, working_copy: bool = True,
                     loss_kernel: str | None = None, cpu_backend: bool = False, **fields) -> "Policy":
        """The policy that the choices a user makes describe, with what they imply (the CLI's
        policy flags build their Policy here, so a Python caller gets the same one):
        master: one of MASTER_CHOICES ('split' is an fp32 master with split_master), or None:
        'split' where split_possible, else 'fp32' (Policy's own default);
        grad_clip None: the optimizer mode's default (default_grad_clip); working_copy: wanted,
        kept only where it is not the master itself (not with fp32 compute, nor with a master
        already in compute_dtype); gradients cross the link in fp32 under fp32 compute;
        loss_kernel None: default_loss_kernel(cpu_backend); optimizer None: 'after' with adapters
        (lora_rank), else Policy's default. `fields`: Policy's other fields."""
        if master is not None and master not in MASTER_CHOICES:
            raise HorizonError(f"policy master={master!r}; allowed: {', '.join(MASTER_CHOICES)}")
        if master == "split" and not working_copy:
            raise HorizonError("policy master='split' (--master-dtype split) keeps the master's high half as the "
                               "working copy: drop --no-working-copy (working_copy=False)")
        compute = fields.get("compute_dtype", _DEFAULT.compute_dtype)
        if fields.get("optimizer") is None:  # adapters update on the device after the backward
            fields["optimizer"] = "after" if fields.get("lora_rank") else _DEFAULT.optimizer
        optimizer = fields["optimizer"]
        if compute == "fp32":
            fields["grad_dtype"] = "fp32"
        return cls(**fields, master_dtype="fp32" if master == "split" else master,
                   loss_kernel=cls.default_loss_kernel(cpu_backend) if loss_kernel is None else loss_kernel,
                   split_master=None if master is None else master == "split",
                   working_copy=working_copy and compute != "fp32" and master != compute,
                   grad_clip=cls.default_grad_clip(optimizer) if grad_clip is None else grad_clip)

    @staticmethod
    def default_loss_kernel(cpu_backend: bool) -> str:
        """loss_kernel when none is given: 'fused' for the CPU backend (where the native kernel
        builds; `horizon train` checks), 'torch' for GPUs (the native kernel is CPU code)."""
        return "fused" if cpu_backend else _DEFAULT.loss_kernel

    @staticmethod
    def default_grad_clip(optimizer: str) -> float:
        """grad_clip when none is given: 0 (off) with optimizer='backward', which cannot clip
        exactly; else Policy's default."""
        return 0.0 if optimizer == "backward" else _DEFAULT.grad_clip

    @property
    def master_choice(self) -> str:
        """How the master is kept, as from_choices takes it: 'split' or master_dtype."""
        return "split" if self.split_master else self.master_dtype

    @property
    def default_master_choice(self) -> str:
        """The master_choice a policy like this one gets when none is given."""
        return "split" if split_possible(self.compute_dtype, self.working_copy) else "fp32"

    @property
    def master_is_default(self) -> bool:
        """The master is the one this policy gets when none is given (no --master-dtype needed)."""
        return self.master_choice == self.default_master_choice


def split_possible(compute_dtype: str, working_copy: bool) -> bool:
    """Whether an fp32 master can be split (split_master): its high half is the bf16 working
    copy, so it needs bf16 compute and the working copy. Everything else is the same as with
    the whole fp32 master (optimizer modes, micro-batch orders, moments and gradient dtypes, the
    disk tier, data parallelism): the optimizer kernel updates the split master bit for bit as
    the fp32 one (test_exec_split_master, test_exec_default_master). What differs is the
    working copy on exact ties (low 16 bits 0x8000 under an even high half, 1 pattern in
    131,584): the split copy rounds them away from zero, the whole master's copy (torch's cast)
    to even, one bf16 ulp apart (adamw.c, "The split master")."""
    return compute_dtype == "bf16" and working_copy


_DEFAULT = Policy()


def exact_policy(**overrides) -> Policy:
    """All-fp32 policy for exactness tests: fp32 compute, grads and master; no working copy."""
    base = dict(compute_dtype="fp32", grad_dtype="fp32", master_dtype="fp32",
                states_dtype="fp32", working_copy=False)
    base.update(overrides)
    return Policy(**base)


def _path_ends(path: str, tail: str) -> bool:
    """`path` ('mlp.experts.down_proj') ends with `tail` at a name boundary ('experts.down_proj')."""
    return path == tail or path.endswith("." + tail)


def _is_stack(name: str) -> bool:
    """A lora_targets name of a routed-expert stack: its next-to-last part is 'experts'."""
    parts = name.split(".")
    return len(parts) > 1 and parts[-2] == EXPERT_TARGET


def _has_layer(name: str) -> bool:
    """A target name with a layer index among its parts ('7.mlp.experts.down_proj')."""
    return any(part.isdigit() for part in name.split("."))


def _first_stack(layers: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> str:
    """'<layer>.<stack>' for the first block that has an expert stack (DeepSeek's first blocks
    are dense, so '0.<stack>' would name a stack that layer lacks)."""
    return next(f"{i}.{ss[0]}" for i, (_, ss) in enumerate(layers) if ss)


def _layer_of(name: str, prefix: str) -> tuple[int, str] | None:
    """(layer, the path after it) of a target naming one layer, as peft matches it: the name
    ends the full path '<prefix><layer>.<path>' (so '7.mlp.experts.down_proj' and
    'model.layers.7.mlp.experts.down_proj' both name layer 7, as '7.self_attn.q_proj' does a
    Linear module); None for a name without a layer index or whose parts before it are not the
    tail of `prefix`."""
    parts = name.split(".")
    i = next((k for k, part in enumerate(parts) if part.isdigit()), None)
    if i is None or i == len(parts) - 1:
        return None
    head, pre = parts[:i], [x for x in prefix.split(".") if x]
    if head and pre[len(pre) - len(head):] != head:
        return None
    return int(parts[i]), ".".join(parts[i + 1:])


@lru_cache(maxsize=4096)
def _at_layer(policy: Policy, layer: int, prefix: str) -> Policy:
    names = [n.strip() for n in policy.lora_targets.split(",")]
    mine = [q[1] if (q := _layer_of(n, prefix)) is not None and q[0] == layer else n for n in names]
    return policy if mine == names else replace(policy, lora_targets=",".join(mine))
