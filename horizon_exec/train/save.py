"""The outputs at the two ends of `horizon train`: room for them before the first step, and
--save-hf after the last one: under signal handling (the first SIGINT/SIGTERM lets the save
finish, then the run exits 130/143; a second aborts it and nothing half-written stays), with a
write failure as one line naming the folder, the space it needs and where the trained weights
still are.

What the save copies besides the weights (the source config.json, the tokenizer's files, the
generation config) is read when the run starts (read_save_inputs), so a folder deleted or
swapped during training changes nothing: the save writes what the model was trained with, and
a file that cannot be read is refused before the first step, named. The one exception is a
multimodal --init-from (Gemma 3): its vision tower and projector, which the run does not hold,
are copied from that folder at the save (checkpoints/hf_wrapped.py), so its files must stay."""
import re
from dataclasses import dataclass
from pathlib import Path

from horizon_exec.checkpoints import hf_checkpoint
from horizon_exec.checkpoints.hf_checkpoint import SAVE_DTYPES
from horizon_exec.checkpoints.hf_wrapped import wrapped
from horizon_exec.checkpoints.ckpt import candidates, checkpoint_bytes, node_folder
from horizon_exec.checkpoints.fileio import OutputError, write_failure
from horizon_exec.train.loop import Interrupted
from horizon_exec.train.ckpt_space import ckpt_dir_need, existing_checkpoints
from horizon_exec.train.config import OutputsConfig, RunConfig
from horizon_exec.train.outputs import check_file_sizes, check_space, largest_shard_bytes
from horizon_exec.train.stop_signals import StopSignals, say
from horizon_exec.train.stop_signals import name as signal_name
from horizon_sim.errors import HorizonError


def check_space_for(cfg: RunConfig, tr) -> None:
    """Room for the most checkpoints the --ckpt-dir holds at once (ckpt_space.py: --keep-ckpts
    K holds K + 1 while one is written; a resumed run's checkpoints there are used space
    already) and the --save-hf folder, and files within the file size limit, before the first
    step."""
    needs, files = [], []
    ck, out = cfg.checkpoints, cfg.outputs
    if ck.ckpt_dir:
        each = checkpoint_bytes(tr)
        root = Path(node_folder(ck.ckpt_dir, tr.dist))   # where this node's saves write and prune
        start = _resume_start(ck.resume or ck.ckpt_dir, tr.dist) if ck.resume is not None else 0
        need = ckpt_dir_need(each, existing_checkpoints(root), start, cfg.steps, ck.save_every, ck.keep_ckpts)
        needs.append(("--ckpt-dir", Path(ck.ckpt_dir), need.extra_bytes, need.detail()))
        # the state file is the checkpoint less the slack checkpoint_bytes allows for the rest
        files.append(("--ckpt-dir", Path(ck.ckpt_dir) / "step-N" / "state.safetensors", each - (1 << 20)))
    if out.save_hf:
        # added to the checkpoints' peak: the save comes after the last checkpoint, when at most one
        # fewer is there, so this overstates the need by at most a checkpoint, never understates it
        needs.append(("--save-hf", Path(out.save_hf).parent, _hf_bytes(out, tr)))
        itemsize = SAVE_DTYPES[out.save_dtype][0].itemsize
        files.append(("--save-hf", Path(out.save_hf) / "model*.safetensors", largest_shard_bytes(
            (e.numel * itemsize for e in _hf_entries(tr)), out.save_shard_bytes)))
    check_space(needs)
    check_file_sizes(files)


def _resume_start(path, dist) -> int:
    """The step a resumed run starts from, as the folder names tell it (the checkpoint resume
    tries first, TrainLoop.resume); 0 when they do not (more saves: never less room counted)."""
    if dist.world > 1 and not Path(path).name.startswith("node-"):
        path = node_folder(path, dist)
    for p in candidates(path)[:1]:
        m = re.fullmatch(r"step-([0-9]+)", p.name)
        if m:
            return int(m.group(1))
    return 0


def _hf_entries(tr):
    from horizon_exec.model.layout import host_layout
    return [e for u in tr.units for e in host_layout(tr.model, u).entries]


def _hf_bytes(out: OutputsConfig, tr) -> int:
    from horizon_exec.model.layout import host_layout
    return sum(host_layout(tr.model, u).numel for u in tr.units) * SAVE_DTYPES[out.save_dtype][0].itemsize


@dataclass(frozen=True)
class SaveInputs:
    """What --save-hf copies besides the weights, as read at the start of the run."""
    base_config: dict | None
    """The source config.json (kept, only what training changed is rewritten), or None."""
    side: tuple[tuple[str, bytes], ...]
    """(file name, contents) of the tokenizer's files and the model's side files."""
    carry: object = None
    """A multimodal --init-from's wrapping (checkpoints/hf_wrapped.Wrapped): its other tensors are
    copied from that folder at the save, beside the trained language model."""


def read_save_inputs(cfg: RunConfig, tok, init_dir) -> SaveInputs:
    """Read now what the save copies at the end (module docstring); a file that cannot be read
    is a HorizonError naming it (exit 2, before the first step)."""
    # The source config.json is kept (only what training changed is rewritten) and the
    # tokenizer the model was trained with goes along, chat template included.
    try:
        base = hf_checkpoint.base_config(init_dir, cfg.model)
    except (OSError, ValueError) as e:
        where = getattr(e, "filename", None) or cfg.init_from or cfg.model
        raise HorizonError(f"--save-hf: cannot read the model's config {where} to copy: "
                           f"{getattr(e, 'strerror', None) or e}") from None
    side = []
    for f in (*tok.files, *hf_checkpoint.model_side_files(init_dir)):
        f = Path(f)
        if not hf_checkpoint.copied_side_file(f):
            continue
        try:
            side.append((f.name, f.read_bytes()))
        except OSError as e:
            raise HorizonError(f"--save-hf: cannot read {f} to copy: {e.strerror or e}") from None
    return SaveInputs(base, tuple(side), wrapped(init_dir) if init_dir is not None else None)


def save_hf(cfg: RunConfig, tr, loop, inputs: SaveInputs | None) -> None:
    """--save-hf; a write failure is one line naming the folder, the need, and where the
    trained weights still are. inputs: read_save_inputs's, from the start of the run."""
    base, side, carry = (inputs.base_config, inputs.side, inputs.carry) if inputs is not None else (None, (), None)
    out, ckpt_dir = cfg.outputs, cfg.checkpoints.ckpt_dir
    ck = loop.last_ckpt[1] if loop.last_ckpt and loop.last_ckpt[0] == loop.step else None

    def interrupted(signum, immediate, why=""):
        return Interrupted(signum, loop.step, ck, immediate, during=f"--save-hf {out.save_hf}", why=why,
                           no_checkpoint="none of the last step" if ckpt_dir else "no --ckpt-dir")

    def first(signum):  # the save is the run's last work: finish it rather than lose it
        say(f"\n{signal_name(signum)} received: finishing --save-hf first (send it again to abort it; "
            "nothing half-written stays)\n")

    def second(signum):  # unwinding removes the staging folder
        raise interrupted(signum, immediate=True)

    try:
        with StopSignals(first, second) as sig:
            saved = hf_checkpoint.save_hf(tr, out.save_hf, out.save_dtype, out.save_shard_bytes, base, side, carry)
    except OSError as e:
        kept = (f"the trained weights are in the checkpoint {ck}" if ck else
                "no checkpoint holds the trained weights" + ("" if ckpt_dir else " (no --ckpt-dir)"))
        why = write_failure(f"the HF checkpoint {out.save_hf}", e, Path(out.save_hf).parent, _hf_bytes(out, tr))
        raise OutputError(f"--save-hf: {why}; {kept}") from None
    if tr.adapters is not None:
        print(f"saved {out.save_dtype} HF checkpoint of the base with the adapters merged to {saved}, and the "
              f"adapters alone (peft's format: PeftModel.from_pretrained(base, ...)) to {saved / 'adapter'}")
    else:
        print(f"saved {out.save_dtype} HF checkpoint to {saved}")
    if sig.signum is not None:
        raise interrupted(sig.signum, immediate=False, why="after completing --save-hf")
