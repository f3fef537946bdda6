"""What a checkpoint of a Trainer holds, declared once, by the trainer (Trainer.state_items), in
the manner of torch.distributed.checkpoint's Stateful: checkpoints/ckpt.py writes the declared
tensors and metadata, reads a checkpoint into the tensors a declaration names (refusing one whose
names, shapes or dtypes differ from it) and hands the metadata back (Trainer.load_state_items);
it reads nothing else of the trainer.

The tensors: everything a resumed step reads from the host store.
    master.<unit>    fp32 master (a split master: joined a unit at a time, split again when read,
                     so the format is the fp32 master's whatever the policy's split_master)
    moments.<unit>   Adam m | v (the disk tier's: copied out of and back into its file a unit at a time)
    <grad norms>     the gradient-norm scalars
    <host grads>     the previous step's gradients, only while a pipelined update is pending
    steps.<unit>     the per-unit Adam step counters
    base.<unit>      adapters (Policy.lora_rank): the frozen base, in the compute dtype
    adapters.<unit>  the block's adapters and their AdamW moments (from the device), and
    steps.adapters   their Adam step counter
    buffers.<name>   a block's non-parameter tensors (DeepSeek-V3's router bias: model/block_buffers.py)
The working copy is not held: it is the master cast, rebuilt on load.
The metadata (JSON): "trainer" (TrainerState: steps done, the pending flag and its lr, ...) and
what the state was written for: "model", "policy", "optimizer" (AdamW's betas, eps, weight
decay), "layout" (the data-parallel layout and this node), and on the CPU backend "runtime" (its
compute threads: GEMMs sum in another order on another count, so a resume that is to equal the
uninterrupted run bit for bit takes the same)."""
import dataclasses
from dataclasses import dataclass

from horizon_exec.checkpoints.fileio import Deferred
from horizon_exec.model.layout import unit_name
from horizon_sim.schedule.op import Holds, Space


@dataclass(frozen=True, slots=True)
class StateTensor:
    """One tensor of a trainer's checkpoint."""
    target: object
    """A torch.Tensor written from and read into in place, or a Deferred (one that exists a unit
    at a time: made when written, handed back when read)."""
    holds: Holds | None
    """What it holds, for the load's value checks (ckpt_invariants.py); None: an Adam step counter."""
    owned: bool = True
    """This process reads it. Data parallel: the node's shared store is its leader's to read, and
    a rank that is not the leader skips it (then the file's checksum cannot be verified there)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.target.shape)

    @property
    def dtype(self):
        return self.target.dtype


@dataclass(frozen=True, slots=True)
class StateItems:
    """A trainer's declaration of its checkpoint (module docstring)."""
    tensors: dict[str, StateTensor]
    """name -> tensor, in the order written."""
    meta: dict
    """"trainer", "model", "policy", "optimizer", "layout": JSON values."""


def fp32_master_name(low_name: str) -> str:
    """The name an fp32 master's buffer has (declare.host_store), from its split low half's."""
    return "master." + low_name.removeprefix("master_lo.")


def declare(tr, state, pending: bool) -> StateItems:
    """Trainer tr's declaration, its host store holding pending pipelined gradients or not;
    state: its TrainerState."""
    d = tr.dist
    follower = d.world > 1 and not d.is_leader
    tensors = {}
    for b in tr.sched.buffers.values():
        owned = not (follower and b.node_shared)
        if b.holds == Holds.MASTER_LOW:  # a split master is saved as the fp32 master it holds
            tensors[fp32_master_name(b.name)] = StateTensor(_split_master(tr, b), Holds.MASTER, owned)
        elif b.space == Space.DISK:
            tensors[b.name] = StateTensor(_on_disk(tr, b), b.holds, owned)
        elif b.name not in tr.store or b.holds == Holds.WORKING_COPY:  # the copy is rebuilt from the master
            continue
        elif b.holds == Holds.HOST_GRAD and not pending:  # only pending pipelined grads matter
            continue
        else:
            tensors[b.name] = StateTensor(tr.store.t[b.name], b.holds, owned)
    for u, s in tr.store.steps.items():
        tensors[f"steps.{unit_name(tr.model, u)}"] = StateTensor(s, None)
    ad = tr.runner.adapters
    if ad is not None:  # adapters: on the device (their gradients are zero between steps)
        for u, t in ad.state.items():
            tensors[f"adapters.{unit_name(tr.model, u)}"] = StateTensor(_on_device(t), Holds.ADAPTERS)
        tensors["steps.adapters"] = StateTensor(_on_device(ad.step), None)
    bufs = tr.runner.block_buffers  # a block's non-parameter tensors (model/block_buffers.py), fp32
    for full, (u, n) in bufs.full_names().items():
        tensors[f"buffers.{full}"] = StateTensor(_block_buffer(bufs, u, n), Holds.BASE_WEIGHTS)
    a = tr.runner.adamw
    meta = {"trainer": dataclasses.asdict(state), "model": tr.model.to_dict(), "policy": tr.policy.to_dict(),
            "optimizer": {"betas": list(a.betas), "eps": a.eps, "weight_decay": a.weight_decay},
            # data parallel: the node's shard of the store (ckpt_dir/node-J when several nodes)
            "layout": {**dataclasses.asdict(d.layout), "node": d.node}}
    threads = getattr(tr.backend, "compute_threads", None)
    if threads is not None:  # the CPU backend's intra-op threads: a GEMM's sums depend on them, so a
        meta["runtime"] = {"compute_threads": threads}  # resume takes the same ones (cli/train_cmd.py)
    return StateItems(tensors, meta)


def _split_master(tr, b) -> Deferred:
    """A split master's unit as an fp32 tensor that exists one unit at a time: joined when
    written, split into the store when read."""
    import torch

    return Deferred(shape=tuple(b.shape), dtype=torch.float32, make=lambda: tr.master.node(b.unit),
                    done=lambda t: tr.master.set_node(b.unit, t))


def _on_disk(tr, b) -> Deferred:
    """A disk-tier buffer as a tensor that exists one unit at a time: read from the file when
    written, written to the file when read (the checkpoint, not the file, is what a resumed run
    starts from: disk_store.py)."""
    import torch

    from horizon_exec.dtypes import TORCH_DTYPE

    def make():
        t = torch.empty(b.shape, dtype=TORCH_DTYPE[b.dtype])
        tr.disk.read(b.name, t)
        return t

    return Deferred(shape=tuple(b.shape), dtype=TORCH_DTYPE[b.dtype], make=make,
                    done=lambda t: tr.disk.write(b.name, t))


def _on_device(t) -> Deferred:
    """A device tensor as the host copy a checkpoint writes, copied back in place when read."""
    return Deferred(shape=tuple(t.shape), dtype=t.dtype, make=lambda: t.detach().to("cpu", copy=True),
                    done=lambda h: t.copy_(h.to(t.device)))


def _block_buffer(bufs, u: int, name: str) -> Deferred:
    """Block u's buffer `name` (host fp32), set on the host and the device when read back."""
    t = bufs.host[u][name]
    return Deferred(shape=tuple(t.shape), dtype=t.dtype, make=lambda: t.clone(), done=lambda h: bufs.set_(u, name, h))
