"""What the reports/ build covers: BuildConfig names every model, machine and policy of each
section; FULL is the committed report and QUICK a small stand-in with the same structure, for
tests and `--quick`."""
from dataclasses import dataclass, field

from horizon_sim.specs.families import family
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import Policy


def _takes_default_seq(spec) -> bool:
    """Whether a preset takes the default policy's sequences (GPT-2's 1024 learned positions do not)."""
    return not family(spec.family).learned_positions or spec.max_position >= Policy().seq


@dataclass(frozen=True)
class BuildConfig:
    """Every model, machine and policy the report covers. FULL is the committed report;
    QUICK is a small stand-in with the same structure, for tests."""

    headline_model: str = "dense-120b"
    headline_gpu: str = "h200"
    headline_ram: str = "1.5TB"
    headline_policy: Policy = Policy(batch=8, seq=4096)
    """The default policy at the paper's batch shape (8 x 4096, as `make demo`)."""
    table_models: tuple[str, ...] = ("llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b")
    table_gpus: tuple[str, ...] = ("a100-80gb", "h100-pcie")
    table_rams: tuple[str, ...] = ("256GiB", "512GiB", "1TiB")
    table_policy: Policy = Policy()
    """The default policy; tune() searches from it and keeps its numerics (clip, dtypes)."""
    modes_model: str = "llama-3.1-8b"
    modes_gpu: str = "h100-pcie"
    modes_ram: str = "512GiB"
    modes_policy: Policy = Policy(batch=8, seq=4096)
    """optimizer is set per mode; grad_clip becomes 0 for 'backward' (it cannot clip exactly)."""
    ckpt_models: tuple[str, ...] = ("llama-3.1-8b", "qwen2.5-32b")
    ckpt_gpu: str = "h100-pcie"
    ckpt_ram: str = "512GiB"
    ckpt_policy: Policy = Policy(batch=8, seq=4096)
    map_gpu: str = "h100-pcie"
    map_models: tuple[str, ...] = tuple(n for n, s in PRESETS.items() if n != "tiny" and _takes_default_seq(s))
    """Every preset but those whose learned positions are shorter than the map's sequences."""
    map_rams: tuple[str, ...] = ("128GiB", "256GiB", "384GiB", "512GiB", "768GiB", "1TiB",
                                 "1.5TiB", "2TiB")
    map_lean: dict = field(default_factory=lambda: {"optimizer": "backward", "grad_clip": 0.0,
                                                    "working_copy": False})
    """The second map's policy: the default with the leanest host footprint at fp32 moments."""
    scale_models: tuple[str, ...] = ("dense-120b", "llama-3.1-405b")
    scale_gpu: str = "h200"
    scale_ram: str = "1.5TB"
    scale_gpus_per_node: int = 8
    scale_nodes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    scale_devices: tuple[int, ...] = (1, 2, 4, 8)
    """Devices per node on one node (the second sweep of section 6)."""
    scale_policy: Policy = Policy(batch=4, seq=4096, optimizer="backward", grad_clip=0.0, act_ckpt_on="device")
    peer_platforms: tuple = (("a100-80gb", "256GiB"), ("h100-pcie", "512GiB"), ("h200", "1.5TB"))
    """The paper's platforms for the comparison with DeepSpeed ZeRO-3 offload (section 7)."""
    peer_models: tuple[str, ...] = ("llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "dense-120b")
    peer_policy: Policy = Policy(batch=8, seq=4096)
    peer_scaling_machine: tuple = ("h200", "1.5TB")
    peer_width: int = 8192
    peer_depths: tuple[int, ...] = (20, 40, 80, 120)
    """Depth sweep at peer_width."""
    peer_depth: int = 40
    peer_widths: tuple[int, ...] = (4096, 8192, 12288, 16384)
    """Width sweep at peer_depth."""
    host_model: str = "dense-120b"
    host_gpu: str = "h200"
    host_ram: str = "1.5TB"
    host_disk: str = "8TB"
    host_disk_GBps: str = "25"
    host_policy: Policy = Policy()
    host_max_model: bool = True
    """Section 8 also asks max-model under each exact-fp32 policy set (seconds)."""
    throughput_cases: tuple = (
        ("dense-120b", "h200", "1.5TB", Policy(batch=8, seq=4096, act_ckpt_on="device", optimizer="backward",
                                               grad_clip=0.0, split_master=True)),
        ("llama-3.1-70b", "h100-pcie", "512GiB", Policy(batch=16, seq=2048, micro_batches=8, optimizer="backward",
                                                        grad_clip=0.0, split_master=True)),
        ("llama-3.1-8b", "rtx-4090", "128GB", Policy(batch=8, seq=2048, micro_batches=4, optimizer="backward",
                                                     grad_clip=0.0, split_master=True)),
    )
    """Section 10: (model, GPU, RAM, policy). The headline's tuned policy at its batch, and the two
    cases issue 27 names at batches whose micro-batches a 24 GB / 80 GB device needs, with the
    headline's exact lean numerics (split master, optimizer in backward, no clipping)."""

    moe_base_policy: Policy = Policy(batch=16, seq=2048)
    moe_cases: tuple = (
        ("qwen3-30b-a3b", "rtx-4090", "512GB", None, {}),
        ("qwen3-30b-a3b", "h100-pcie", "512GiB", None, {}),
        ("mixtral-8x7b", "a100-80gb", "1TB", None, {}),
        ("qwen3-235b-a22b", "h200", "1.5TB", None, {}),
        ("qwen3-235b-a22b", "h200", "1.5TB", ("4TB", "7"),
         dict(disk_tier="moments+low", optimizer="backward", grad_clip=0.0, max_host_grads=2)),
    )
    """Section 11: (model, GPU, RAM, disk (size, GB/s) or None, policy changes): the questions
    issue 28 asks. The disk is an estimate: one PCIe Gen4 NVMe drive."""

    adapters_machines: tuple = (("h200", "1TB"), ("rtx-4090", "192GB"), ("h100-pcie", "512GiB"))
    adapters_policy: Policy = Policy(lora_rank=16, optimizer="after")
    adapters_full_policy: Policy = Policy()
    adapters_bases: tuple = ("none", "nf4")  # Policy.base_quant of the rows per machine
    """Section 12: the machines issue 42 names; LoRA against full fine-tuning (max-model's lean set)."""

    frontier_policy: Policy = Policy(batch=16, seq=2048)
    frontier_lean_policy: Policy = Policy(batch=16, seq=2048, optimizer="backward", grad_clip=0.0,
                                          states_dtype="bf16", max_host_grads=2)
    frontier_boxes: tuple = (("gpt-oss-120b", "h200", "1.5TB"), ("gpt-oss-120b", "h100-sxm", "2TB"))
    frontier_nodes: tuple = ("deepseek-v3", "h200", "1.5TB", 8, (1, 2, 4, 8), ("16TB", "7"))
    """Section 13: the machines issue 41 names: (model, GPU, RAM) boxes; (model, GPU, RAM per node,
    GPUs per node, node counts, (NVMe size, GB/s) for the disk-tier row)."""
    frontier_lora_policy: Policy = Policy(batch=16, seq=2048, lora_rank=16, optimizer="after", lora_targets=",".join(
        ["all-linear"] + [f"{u}.mlp.experts.{n}" for u in (7, 15, 23) for n in ("gate_up_proj", "down_proj")]))
    frontier_lora_boxes: tuple = (("gpt-oss-120b", "h100-sxm", "256GB", "none"), ("gpt-oss-120b", "h100-pcie", "128GB", "nf4"),
                                  ("gpt-oss-120b", "rtx-4090", "128GB", "nf4"))
    """Section 13's LoRA rows: gpt-oss-120b adapted as its fine-tuning recipes adapt it (rank 16 on
    every Linear projection and the experts of layers 7, 15 and 23), on (model, GPU, RAM, base form)."""

FULL = BuildConfig()
QUICK = BuildConfig(
    headline_model="qwen2.5-0.5b", headline_gpu="h100-pcie", headline_ram="18GiB",
    headline_policy=Policy(batch=4, seq=1024),
    table_models=("tiny", "qwen2.5-0.5b"), table_gpus=("h100-pcie",), table_rams=("16GiB",),
    modes_model="tiny", modes_policy=Policy(batch=4, seq=512),
    ckpt_models=("tiny", "qwen2.5-0.5b"), ckpt_policy=Policy(batch=4, seq=1024),
    map_models=("tiny", "qwen2.5-0.5b", "llama-3.1-8b"), map_rams=("16GiB", "64GiB", "256GiB"),
    scale_models=("qwen2.5-0.5b",), scale_gpu="h100-sxm", scale_ram="16GiB", scale_gpus_per_node=2,
    scale_nodes=(1, 2), scale_devices=(1, 2), scale_policy=Policy(batch=2, seq=512),
    peer_platforms=(("h100-pcie", "64GiB"),), peer_models=("tiny", "qwen2.5-0.5b"), peer_policy=Policy(batch=2, seq=512),
    peer_scaling_machine=("h100-pcie", "64GiB"), peer_width=512, peer_depths=(2, 4), peer_depth=2,
    peer_widths=(256, 512),
    host_model="qwen2.5-0.5b", host_gpu="h100-pcie", host_ram="16GiB", host_disk="64GiB",
    host_policy=Policy(batch=2, seq=512), host_max_model=False,
    throughput_cases=(("qwen2.5-0.5b", "h100-pcie", "16GiB", Policy(batch=4, seq=512, micro_batches=2)),),
    moe_base_policy=Policy(batch=2, seq=512), moe_cases=(("qwen3-30b-a3b", "rtx-4090", "512GB", None, {}),),
    adapters_machines=(("rtx-4090", "16GiB"),), adapters_policy=Policy(batch=2, seq=512, lora_rank=8, optimizer="after"),
    adapters_full_policy=Policy(batch=2, seq=512),
    frontier_policy=Policy(batch=2, seq=512),
    frontier_lean_policy=Policy(batch=2, seq=512, optimizer="backward", grad_clip=0.0, states_dtype="bf16"),
    frontier_boxes=(("gpt-oss-20b", "h100-pcie", "256GiB"),),
    frontier_nodes=("deepseek-v2-lite", "h100-pcie", "64GiB", 2, (1, 2), ("1TB", "7")),
    frontier_lora_policy=Policy(batch=2, seq=512, lora_rank=8, optimizer="after",
                                lora_targets="all-linear,1.mlp.experts.gate_up_proj,1.mlp.experts.down_proj"),
    frontier_lora_boxes=(("gpt-oss-20b", "h100-pcie", "64GiB", "nf4"),),
)
