"""Policy flags shared by every command that runs or plans a step."""
import argparse

from horizon_sim.errors import HorizonError
from horizon_sim.specs.quant import QUANT_FORMATS
from horizon_sim.specs.policy import (ADAPTER_PLACES, CKPT_PLACES, DPO_LOSSES, OBJECTIVES, DISK_TIERS, DTYPES, HOST_UPDATE_FIELDS, KEEP_ALL, LORA_ALL,
                                      LOSS_KERNELS, MASTER_CHOICES, MASTER_ROUNDINGS, MB_ORDERS, OPTIMIZER_MODES, Policy)

_D = Policy()


def _renamed(use: str):
    """An argparse action for a flag renamed because it could be misread: refused, naming what
    to use (hidden from --help)."""
    class Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"{option_string} was renamed: {use}")
    return Renamed


def keep_layers(text: str) -> int:
    """--keep-activations: a number of layers >= 0, or 'all' (KEEP_ALL)."""
    if text.strip().lower() == "all":
        return KEEP_ALL
    try:
        n = int(text)
    except ValueError:
        n = -2
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of layers >= 0 or 'all'")
    return n


PLANNER = "the planner's choice"


def add_policy_args(p: argparse.ArgumentParser, defaults: Policy = _D, compute_help: str | None = None,
                    searched: str | None = None) -> None:
    """compute_help: the command picks the compute dtype's default itself (--compute-dtype then
    defaults to None, resolved before policy_from_args), and says how here. searched: the
    command searches the knobs no flag pins (plan/pinned.py); their help says so, then this
    text ('{v}' standing for the value: e.g. what it is when no search runs); None: no search."""
    def d(value) -> str:  # a knob's default, as its help says it
        return f"(default: {PLANNER}{searched})".replace("{v}", str(value)) if searched is not None else f"(default {value})"

    g = p.add_argument_group("policy")
    # "ckpt" meant both activation checkpoints (these) and training checkpoints (horizon train
    # --ckpt-dir/--save-every): the old names are refused rather than silently read as one.
    g.add_argument("--ckpt-every", action=_renamed("use --act-ckpt-every K for the activation-checkpoint interval, "
                                                   "or horizon train --save-every N to save training checkpoints"),
                   help=argparse.SUPPRESS, default=argparse.SUPPRESS)
    g.add_argument("--ckpt-on", action=_renamed("use --act-ckpt-on device|host"), help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)
    g.add_argument("--batch", type=int, default=defaults.batch, help=f"sequences per step (default {defaults.batch})")
    g.add_argument("--seq", type=int, default=defaults.seq,
                   help=f"tokens per sequence (default {defaults.seq}, or a model's learned positions where fewer: "
                        "GPT-2's 1024)")
    g.add_argument("--micro-batches", type=int, default=defaults.micro_batches,
                   help="micro-batches per step; gradients accumulate on the host (--mb-order layer: on the "
                        f"device) {d(defaults.micro_batches)}")
    g.add_argument("--mb-order", choices=MB_ORDERS, default=defaults.mb_order,
                   help="'micro': each micro-batch runs the whole step in turn (weights cross the link per "
                        "micro-batch); 'layer': every micro-batch passes a unit while its weights are resident "
                        "(weights cross twice per step, gradients summed on the device and offloaded once; "
                        f"every micro-batch's activations live on the device at once) {d(defaults.mb_order)}")
    g.add_argument("--act-ckpt-every", type=int, default=defaults.act_ckpt_every, metavar="K",
                   help=f"keep a boundary activation every K layers; backward recomputes the rest {d(defaults.act_ckpt_every)}")
    g.add_argument("--keep-activations", type=keep_layers, default=defaults.keep_last, metavar="L|all",
                   help="the last L layers of the forward keep what autograd saves on the device and run their "
                        "backward from it, no recompute ('all': every layer; device memory grows with L) "
                        f"{d(defaults.keep_last)}")
    g.add_argument("--slots", type=int, default=defaults.slots,
                   help=f"device weight buffers, >= 2 {d(defaults.slots)}")
    g.add_argument("--act-ckpt-on", choices=CKPT_PLACES, default=defaults.act_ckpt_on,
                   help=f"where checkpoints live between forward and backward {d(defaults.act_ckpt_on)}")
    g.add_argument("--optimizer", choices=OPTIMIZER_MODES, default=None,
                   help="when the CPU optimizer runs: after backward, during backward (no exact "
                        f"clipping), or pipelined into the next forward {d(defaults.optimizer)}; with "
                        "--lora-rank the adapters update on the device after the backward ('after')")
    g.add_argument("--grad-clip", type=float, default=None,
                   help=f"global-norm clip, 0 = off (default {defaults.grad_clip}, or 0 with --optimizer backward)")
    g.add_argument("--compute-dtype", choices=DTYPES, default=None if compute_help else defaults.compute_dtype,
                   help=compute_help or f"dtype of the device's matmuls and activations (default {defaults.compute_dtype})")
    # None: Policy's own default (split where it can be), resolved with the other flags
    g.add_argument("--master-dtype", choices=MASTER_CHOICES, default=None,
                   help="host master weights: 'split': the exact fp32 master kept as its bf16 working copy plus "
                        "a 16-bit low half (4 bytes per parameter with the copy, not 6; updated bit for bit as "
                        "the fp32 master; the copy rounds ties away from zero); 'fp32': the whole fp32 master "
                        "beside its copy; 'bf16': no fp32 master (the seed code's policy: an update smaller "
                        "than half a bf16 ulp of its weight is lost) "
                        + (f"(default: {PLANNER} of split or fp32 where split can be, else fp32)" if searched is not None else
                           "(default: split with bf16 compute and the working copy, else fp32)"))
    g.add_argument("--master-rounding", choices=MASTER_ROUNDINGS, default=defaults.master_rounding,
                   help="with --master-dtype bf16: 'nearest' (even; default) or 'stochastic': rounds up with "
                        "probability residual/ulp, so the stored weight equals the updated one in expectation and "
                        "small updates survive on average (draws seeded by --seed, the unit and the step)")
    g.add_argument("--states-dtype", choices=DTYPES, default=defaults.states_dtype,
                   help="Adam moments on the host (default fp32)")
    g.add_argument("--grad-dtype", choices=DTYPES, default=defaults.grad_dtype,
                   help="gradients over the device-to-host link (default bf16)")
    g.add_argument("--no-working-copy", action="store_true",
                   help="no persistent bf16 host copy: loads move fp32 and cast on the device"
                        + (f" (default: {PLANNER} whether to keep one)" if searched is not None else ""))
    g.add_argument("--disk-tier", choices=DISK_TIERS, default=defaults.disk_tier,
                   help="'moments': keep the Adam moments in a file on local disk (--disk SIZE in the planner, "
                        "--disk-dir in train), read into RAM a unit ahead of its update and written back "
                        "after: RAM holds two units' moments instead of 8 B/param (default none)")
    g.add_argument("--doc-masks", action="store_true",
                   help="document-aware attention for packed data: tokens attend only within their "
                        "document, positions restart per document (the attention kernel then runs "
                        "under an explicit mask: all T x T scores, no causal skipping)")
    g.add_argument("--max-host-grads", type=int, default=0, metavar="N",
                   help="with --optimizer backward: at most N units' gradients wait on the host for the "
                        "CPU optimizer; the next offload waits "
                        + (f"(default: {PLANNER}; 0: no bound)" if searched is not None else "(default 0: no bound)"))
    g.add_argument("--loss-chunk-tokens", type=int, default=defaults.loss_chunk_tokens, metavar="N",
                   help=f"tokens per LM-head/loss chunk: the fp32 logits of one chunk live at a time "
                        f"(default {defaults.loss_chunk_tokens})")
    g.add_argument("--loss-kernel", choices=LOSS_KERNELS, default=None,
                   help="the head's loss and its gradient: 'fused': one native pass per row, written over the "
                        "logits (CPU backend; no fp32 copy of the chunk); 'torch': torch kernels on an fp32 copy "
                        "(any device) (default: fused for the CPU backend, torch for GPUs)")
    g.add_argument("--lora-rank", type=int, default=defaults.lora_rank, metavar="R",
                   help="LoRA adapters of rank R on a frozen base: the base stays on the host in the compute dtype "
                        "(about 2 bytes a parameter, no master or moments), streams as in full fine-tuning and gets "
                        "no weight gradients; the adapters and their AdamW state live on the device (default 0: "
                        "full fine-tuning)")
    g.add_argument("--lora-targets", default=defaults.lora_targets, metavar="NAMES",
                   help="with --lora-rank: the block projections that get adapters, comma-separated: Linear "
                        "modules by name as peft's target_modules (q_proj,v_proj), and routed-expert stacks by "
                        "parameter path as its target_parameters (experts.gate_up_proj,experts.down_proj: an "
                        "adapter per expert); a layer index before the path in the block names that layer's alone "
                        "(7.self_attn.q_proj, 7.mlp.experts.down_proj) (default "
                        f"{LORA_ALL}: every Linear projection, no expert stack)")
    g.add_argument("--lora-alpha", type=float, default=defaults.lora_alpha, metavar="A",
                   help="with --lora-rank: the adapters' output is scaled by A / R, as peft's lora_alpha (default "
                        f"{defaults.lora_alpha:g}, peft's; the planner's figures do not depend on it)")
    g.add_argument("--lora-dropout", type=float, default=defaults.lora_dropout, metavar="P",
                   help="with --lora-rank: zero each element of an adapter's input with probability P in training "
                        "(the rest scaled by 1/(1-P)), as peft's lora_dropout (default 0: none)")
    g.add_argument("--objective", choices=OBJECTIVES, default=defaults.objective,
                   help="what a step minimises: 'sft' the token cross-entropy; 'dpo' Direct Preference Optimisation "
                        "on pairs (a chosen then a rejected row), against a reference model computed in the same "
                        "step: with --lora-rank the base without the adapters, else a copy of the starting weights "
                        "in host RAM (default sft)")
    g.add_argument("--dpo-beta", type=float, default=defaults.dpo_beta, metavar="B",
                   help=f"with --objective dpo: DPO's beta (default {defaults.dpo_beta:g}, TRL's)")
    g.add_argument("--dpo-loss", choices=DPO_LOSSES, default=defaults.dpo_loss,
                   help="with --objective dpo: sigmoid (DPO), ipo or robust, as TRL's loss_type (default sigmoid)")
    g.add_argument("--dpo-label-smoothing", type=float, default=defaults.dpo_label_smoothing, metavar="E",
                   help="with --dpo-loss robust: the assumed fraction of flipped preferences, [0, 0.5) (default 0)")
    g.add_argument("--base-quant", choices=QUANT_FORMATS, default=defaults.base_quant,
                   help="with --lora-rank: the frozen base's blocks on the host and over the link as 'nf4' (QLoRA's "
                        "4-bit NormalFloat with double quantization, about 0.52 bytes a parameter) or 'int8' (about "
                        "1 byte), dequantized on the device as each block loads; the embedding, head, norms and an "
                        "MoE router stay in the compute dtype (default none: the compute dtype)")
    g.add_argument("--adapters-on", choices=ADAPTER_PLACES, default=defaults.adapters_on,
                   help="with --lora-rank: where the adapters, their gradients and AdamW moments live (fp32, 16 bytes "
                        "an adapter parameter): 'device' for the whole run; 'host': in host RAM, each block's crossing "
                        "the link with its weights, their gradients summed and their update run on the host's cores, "
                        "for adapters the device cannot hold (default device; the planner's search tries both)")
    g.add_argument("--doc-tokens", type=int, default=0, metavar="N",
                   help="with --doc-masks: mean document length, for model FLOPs and MFU (default: "
                        "--seq; horizon train measures it from the data)")


def policy_to_args(p: Policy) -> dict:
    """{dest: value} of the policy flags that give `p` back through policy_from_args (a job's
    policy as train's flags; the planner's choice written into train's arguments)."""
    return {"batch": p.batch, "seq": p.seq, "micro_batches": p.micro_batches, "mb_order": p.mb_order,
            "act_ckpt_every": p.act_ckpt_every, "keep_activations": p.keep_last, "slots": p.slots,
            "act_ckpt_on": p.act_ckpt_on, "optimizer": p.optimizer, "grad_clip": p.grad_clip,
            "compute_dtype": p.compute_dtype, "master_dtype": p.master_choice, "master_rounding": p.master_rounding,
            "states_dtype": p.states_dtype, "grad_dtype": p.grad_dtype, "no_working_copy": not p.working_copy,
            "disk_tier": p.disk_tier, "doc_masks": p.doc_masks, "max_host_grads": p.max_host_grads,
            "doc_tokens": p.doc_tokens, "loss_chunk_tokens": p.loss_chunk_tokens, "loss_kernel": p.loss_kernel,
            "lora_rank": p.lora_rank, "lora_targets": p.lora_targets, "lora_alpha": p.lora_alpha,
            "lora_dropout": p.lora_dropout, "base_quant": p.base_quant, "adapters_on": p.adapters_on,
            "objective": p.objective,
            "dpo_beta": p.dpo_beta, "dpo_loss": p.dpo_loss, "dpo_label_smoothing": p.dpo_label_smoothing}


_FIELD_DEST = {"split_master": "master_dtype", "working_copy": "no_working_copy"}
NOT_WITH_ADAPTERS = tuple(dict.fromkeys(_FIELD_DEST.get(f, f) for f in HOST_UPDATE_FIELDS if f != "optimizer"))
"""Flags (dests) of the full fine-tuning's host update, which a frozen base does not have
(--optimizer is checked apart: 'after' is what adapters do)."""


def check_adapter_flags(a: argparse.Namespace) -> None:
    """With --lora-rank, a flag of the host update is refused rather than ignored."""
    from horizon_sim.cli.explicit_flags import given
    if not getattr(a, "lora_rank", 0):
        return
    g = given(a)
    for dest in NOT_WITH_ADAPTERS:
        if dest in g:
            raise HorizonError(f"{g[dest]} does not apply with --lora-rank {a.lora_rank}: the frozen base is kept in the "
                               "compute dtype only (no master, moments, host gradients or host update); drop it")
    if getattr(a, "optimizer", None) not in (None, "after"):
        raise HorizonError(f"--optimizer {a.optimizer} does not apply with --lora-rank {a.lora_rank}: the adapters "
                           "update on the device after the backward (--optimizer after)")


def policy_from_args(a: argparse.Namespace, hw=None) -> Policy:
    """The Policy the flags describe (Policy.from_choices: what a Python caller gets from the
    same choices); hw: the hardware it is planned for, whose backend picks the loss kernel's
    default (None: Policy's)."""
    from horizon_sim.specs.cpu_ranks import is_cpu_backend
    check_adapter_flags(a)
    return Policy.from_choices(batch=a.batch, seq=a.seq, micro_batches=a.micro_batches,
                               act_ckpt_every=a.act_ckpt_every, slots=a.slots, act_ckpt_on=a.act_ckpt_on,
                               optimizer=a.optimizer, grad_clip=a.grad_clip, compute_dtype=a.compute_dtype,
                               states_dtype=a.states_dtype, master=getattr(a, "master_dtype", None),
                               master_rounding=getattr(a, "master_rounding", "nearest"), grad_dtype=a.grad_dtype,
                               working_copy=not a.no_working_copy, doc_masks=a.doc_masks, doc_tokens=a.doc_tokens,
                               disk_tier=getattr(a, "disk_tier", "none"), max_host_grads=getattr(a, "max_host_grads", 0),
                               mb_order=getattr(a, "mb_order", "micro"),
                               keep_last=getattr(a, "keep_activations", 0),
                               loss_chunk_tokens=getattr(a, "loss_chunk_tokens", _D.loss_chunk_tokens),
                               loss_kernel=getattr(a, "loss_kernel", None),
                               lora_rank=getattr(a, "lora_rank", 0), lora_targets=getattr(a, "lora_targets", LORA_ALL),
                               lora_alpha=getattr(a, "lora_alpha", _D.lora_alpha),
                               lora_dropout=getattr(a, "lora_dropout", 0.0), base_quant=getattr(a, "base_quant", "none"),
                               adapters_on=getattr(a, "adapters_on", "device"),
                               objective=getattr(a, "objective", "sft"), dpo_beta=getattr(a, "dpo_beta", _D.dpo_beta),
                               dpo_loss=getattr(a, "dpo_loss", _D.dpo_loss),
                               dpo_label_smoothing=getattr(a, "dpo_label_smoothing", _D.dpo_label_smoothing),
                               cpu_backend=hw is not None and is_cpu_backend(hw))


def fit_seq_to_positions(a: argparse.Namespace, model) -> bool:
    """--seq left at its default for a model whose learned positions are fewer (GPT-2's 1024
    against the default 2048): the step is the model's context, and stderr says so (True). A
    --seq given is kept (and refused past the positions by schedule/limits.py)."""
    import sys

    from horizon_sim.cli.explicit_flags import given
    from horizon_sim.specs.families import family
    if "seq" in given(a) or not family(model.family).learned_positions or not 0 < model.max_position < a.seq:
        return False
    print(f"seq {model.max_position}: {model.name}'s learned positions (--seq not given; the default {a.seq} is "
          f"beyond them)", file=sys.stderr)
    a.seq = model.max_position
    return True

