"""Hugging Face checkpoints in and out of the host store, one tensor at a time.

    spec = spec_from_hf_dir("Qwen2.5-0.5B/")          # config.json -> ModelSpec (a family of specs/families)
    tr = Trainer(spec, policy, TrainerConfig(random_init=False))
    load_hf(tr, "Qwen2.5-0.5B/")                       # safetensors -> fp32 master (+ working copy)
    save_hf(tr, "out/", dtype="bf16")                  # master -> safetensors + config.json

Loading never holds the model twice: safetensors files are memory-mapped (`safe_open`), each
tensor is read on its own, cast to fp32 and copied into its place in the store's flat
buffers (names map through layout.py, which uses transformers' names), then dropped. Peak
extra memory is the largest single tensor (an MoE model's experts are stored per expert and
copied into their part of the fused tensor the store holds: hf_experts.py; a save writes them
back per expert, as save_pretrained does). Sharded checkpoints are read through
model.safetensors.index.json; a folder with a single model.safetensors (or one *.safetensors
file) works too.

Saving streams the fp32 master into per-shard safetensors (fp32 or bf16) with fileio's
writer (one tensor of extra memory), plus config.json and, when sharded, the index. The
folder is built under a temporary name and renamed into place (fileio.publish_dir). The
result loads with `AutoModelForCausalLM.from_pretrained(dir)`.
"""
import json
import shutil
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from horizon_exec.checkpoints import hf_fp8 as fp8
from horizon_exec.checkpoints import hf_mxfp4 as mxfp4
from horizon_exec.checkpoints.fileio import publish_dir, staging_dir, write_safetensors, write_text
from horizon_exec.checkpoints.hf_experts import stored_items, stored_parts
from horizon_exec.checkpoints.hf_wrapped import wrapped
from horizon_exec.checkpoints.hf_bnb import is_part, packed_weights, read_packed
from horizon_exec.checkpoints.peft_adapter import ADAPTER_DIR, merged_state_dict, merged_unit, write_adapter
from horizon_exec.data.tokenize import TOKENIZER_FILES
from horizon_exec.model.layout import host_layout
from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import refuse_non_regular
from horizon_sim.safe_read import read_json
from horizon_sim.schedule.op import Holds, Space
from horizon_sim.specs.families import family
from horizon_sim.specs.hf_cache import looks_like_model_id, resolve_model_dir
from horizon_sim.specs.hf_config import IGNORED, from_hf_config, load_model, model_source
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SAVE_DTYPES = {"fp32": (torch.float32, "float32"), "bf16": (torch.bfloat16, "bfloat16")}
DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers' long-standing save_pretrained default
# Files that make a saved folder a usable model besides the weights; copied from the source.
MODEL_SIDE_FILES = ("generation_config.json",)
SIDE_FILES = (*MODEL_SIDE_FILES, *TOKENIZER_FILES)
_SHAPE_FIELDS = ("family", "n_layers", "hidden", "n_heads", "n_kv_heads", "hd", "ffn_hidden", "vocab",
                 "tied_embeddings", "qkv_bias", "mlp_bias")
"""What a checkpoint's tensors fix: a config that differs here describes another model."""
OVERRIDABLE = ("rope_theta", "rope_scaling", "max_position", "layer_windows", "norm_eps", "init_std",
               "padding_idx")
"""What the same weights may be trained with otherwise (a context extension changes rope
scaling and max positions, perhaps the window): --model's value wins over --init-from's."""
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints carry


def resolve_checkpoint(name) -> Path:
    """A checkpoint folder on disk, or a model id ('Qwen/Qwen2.5-0.5B[@rev]') resolved in the
    local Hugging Face cache (never downloaded)."""
    s = str(name)
    if looks_like_model_id(s):
        return resolve_model_dir(s)
    return Path(s)


def spec_from_hf_dir(path) -> ModelSpec:
    """ModelSpec of a local checkpoint folder (its model_type one of specs/families' config rows).
    tie_word_embeddings true with an lm_head.weight in the weights that differs from the
    embedding is an untied model, as transformers loads it (it keeps both, with a warning)."""
    p = Path(path)
    if not p.is_dir():
        raise HorizonError(f"HF checkpoint {str(p)!r} is not a folder (want config.json + *.safetensors)")
    spec = from_hf_config(p)
    if spec.tied_embeddings and distinct_head(p, family(spec.family), wrapped(p)):
        spec = replace(spec, tied_embeddings=False)
    return spec


def distinct_head(path, fam, wrap=None) -> bool:
    """Whether a folder's weights hold an LM head (family `fam`'s name for it: lm_head.weight;
    in a multimodal checkpoint, `wrap`'s) that is not equal to the embedding (transformers 5
    compares them with torch.equal and ties only equal ones)."""
    from safetensors import safe_open
    d = Path(path)
    HEAD, EMBED = fam.head_name, fam.embedding_name
    if wrap is not None:
        HEAD, EMBED = wrap.stored(HEAD), wrap.stored(EMBED)
    where: dict[str, str] = {}
    try:
        for fname, names in weight_files(d).items():
            if names is None:
                with safe_open(str(d / fname), framework="pt", device="cpu") as f:
                    names = list(f.keys())
            where.update({n: fname for n in names if n in (HEAD, EMBED)})
        if HEAD not in where or EMBED not in where:
            return False
        with safe_open(str(d / where[HEAD]), framework="pt", device="cpu") as f:
            head = f.get_tensor(HEAD)
        with safe_open(str(d / where[EMBED]), framework="pt", device="cpu") as f:
            return tuple(head.shape) != tuple(f.get_slice(EMBED).get_shape()) or not torch.equal(head, f.get_tensor(EMBED))
    except HorizonError:
        raise
    except Exception as e:  # a truncated or corrupt file: load_hf names it
        raise HorizonError(f"{d}: cannot read the weights ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class RunModel:
    """The model an --init-from run trains: the checkpoint's spec with --model's overridable
    fields over it."""
    spec: ModelSpec
    overridden: tuple[str, ...]
    """OVERRIDABLE fields --model changed (empty: none, or no --model)."""
    untied_head: bool
    """The config ties the head but the weights hold a distinct one (trained untied)."""


def run_model(init_dir, model_arg=None) -> RunModel:
    """--init-from DIR [--model CFG]: shapes must agree (refused naming the field); rope
    scaling, max positions, sliding windows, rms eps and init std are CFG's (with_overrides)."""
    d = Path(init_dir)
    spec = spec_from_hf_dir(d)
    declared = from_hf_config(d)
    if model_arg is not None and (w := wrapped(d)) is not None:
        raise HorizonError(f"--init-from {init_dir} is a multimodal {w.model_type} checkpoint: its language model "
                           f"trains as its config.json gives it and is saved back inside it; drop --model {model_arg}")
    if model_arg is None:
        return RunModel(spec, (), spec.tied_embeddings != declared.tied_embeddings)
    over = load_model(model_arg)
    check_same_shapes(over, declared, f"--init-from {init_dir}", f"--model {model_arg}")
    merged, changed = with_overrides(spec, over)
    return RunModel(merged, changed, spec.tied_embeddings != declared.tied_embeddings)


def with_overrides(base: ModelSpec, over: ModelSpec) -> tuple[ModelSpec, tuple[str, ...]]:
    """(base with over's OVERRIDABLE fields, the names of those that changed)."""
    changed = tuple(f for f in OVERRIDABLE if getattr(base, f) != getattr(over, f))
    return replace(base, **{f: getattr(over, f) for f in OVERRIDABLE}), changed


def base_config(init_dir, model_arg=None) -> dict | None:
    """The config.json a --save-hf starts from: --init-from's, or --model's file; with both,
    --model's (the config the run trained with) keeping --init-from's metadata it lacks
    (token ids, architectures...). None: a preset without --init-from (hf_export writes it)."""
    init = _read_config(Path(init_dir) / "config.json") if init_dir is not None else None
    if model_arg is None:
        return init
    src = model_source(model_arg)
    over = _read_config(src) if src is not None else to_hf_config_dict(load_model(model_arg))
    if init is None:
        return over if src is not None else None
    return {**{k: v for k, v in init.items() if k in IGNORED}, **over}


def _read_config(path: Path) -> dict:
    cfg = read_json(path)  # read before as a ModelSpec; one line anyway (safe_read.py)
    if not isinstance(cfg, dict):
        raise HorizonError(f"{path}: top level must be a JSON object, got {type(cfg).__name__}")
    return cfg


def check_same_shapes(a: ModelSpec, b: ModelSpec, where: str, what: str = "the model being trained") -> None:
    """HorizonError unless `b` (read from `where`) has the shapes of `a` (`what`)."""
    for f in _SHAPE_FIELDS:
        va, vb = getattr(a, f), getattr(b, f)
        if va != vb:
            raise HorizonError(f"{where}: {f}={vb!r} but {what} has {f}={va!r}")


def weight_files(path) -> dict[str, list[str]]:
    """{file name: [tensor names]} of a checkpoint folder (from the index when sharded)."""
    d = Path(path)
    idx = d / INDEX
    if idx.is_file():
        doc = read_json(idx)  # every parse failure one line (safe_read.py)
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict):
            raise HorizonError(f"{idx}: weight_map must be an object of tensor name -> file name")
        files: dict[str, list[str]] = {}
        for name, fname in wmap.items():
            # a plain file name of this folder: never a path that leads out of it
            if (not isinstance(fname, str) or not fname.endswith(".safetensors") or "/" in fname
                    or "\\" in fname or fname.startswith(".")):
                raise HorizonError(f"{idx}: tensor {name!r} maps to {fname!r}; want a .safetensors file "
                                   "name in the checkpoint folder")
            files.setdefault(fname, []).append(name)
        for fname in files:
            refuse_non_regular(d / fname, "weights file")  # a FIFO would block safe_open forever
            if not (d / fname).is_file():
                raise HorizonError(f"{idx}: shard {fname!r} is missing from {d}")
        return files
    cands = [d / SINGLE] if (d / SINGLE).is_file() else sorted(d.glob("*.safetensors"))
    if len(cands) != 1:
        bins = sorted(d.glob("*.bin"))
        hint = " (PyTorch .bin checkpoints are not read; convert them to safetensors)" if bins else ""
        raise HorizonError(f"{d}: found {len(cands)} safetensors files and no {INDEX}; "
                           f"want one model.safetensors or an index{hint}")
    refuse_non_regular(cands[0], "weights file")  # a FIFO would block safe_open forever
    return {cands[0].name: None}  # names come from the file itself


@torch.no_grad()
def load_hf(trainer, path) -> list[str]:
    """Copy a local HF checkpoint's weights into the trainer's fp32 master (and working
    copy). The config must describe the trainer's model; every tensor must be present, known
    and of the right shape, else a one-line HorizonError names it. Optimizer state is reset
    (moments and step counters zero, no pending update): this is an initialisation. Returns
    what the user should hear about the load (gpt-oss's MXFP4 experts dequantized), one line
    each."""
    from safetensors import safe_open

    d = Path(path)
    check_same_shapes(trainer.model, spec_from_hf_dir(d), str(d / "config.json"))
    # name -> fp32 view into the store (a split master or a quantized base: into a unit's scratch,
    # written into the store once all its tensors have been read)
    params = _UnitSink(trainer) if trainer.viewless_master else trainer.state_dict()
    tied = trainer.model.tied_embeddings
    wrap = wrapped(d)  # a multimodal checkpoint: its language model's tensors, the others carried
    # MoE experts are stored per expert and held fused (hf_experts.py): stored name -> (held
    # name, index); a held tensor is filled once all its stored parts are in
    parts = stored_parts(trainer.model)
    n_parts = Counter(held for held, _ in parts.values())
    expected = [n for n in params if n not in n_parts] + list(parts)
    fp8_block = fp8_block_size(d)  # block-wise FP8 weights (hf_fp8.py): their blocks, or None
    bufs = trainer.runner.block_buffers.full_names()  # non-parameter tensors (model/block_buffers.py)
    expected += list(bufs)
    beyond = extra_layers(trainer.model)  # V3's multi-token-prediction layer: dropped, and said so
    dropped = set()
    seen: set[str] = set()
    files = weight_files(d)
    shard_of = {n: fname for fname, names in files.items() for n in names or ()}
    dequantized = fp8_read = 0  # MXFP4 expert stacks read (hf_mxfp4.py), FP8 weights (hf_fp8.py)
    for fname, names in files.items():
        try:
            with safe_open(str(d / fname), framework="pt", device="cpu") as f:
                stored_names = list(names if names is not None else f.keys())
                here = set(stored_names)
                packed = packed_weights(stored_names)  # bitsandbytes' 4-bit weights (hf_bnb.py)
                for stored in stored_names:
                    if is_part(stored, packed) or (fp8_block and fp8.is_scale(stored)):
                        continue  # read with its weight
                    mx = mxfp4.is_mxfp4_part(stored)
                    if mx and stored.endswith(mxfp4.SCALES):
                        continue  # read with its blocks
                    if mx:
                        stored = stored.removesuffix(mxfp4.BLOCKS)  # the stack's own name
                    name = wrap.held(stored) if wrap is not None else stored
                    if name is None:
                        continue  # carried into --save-hf from this folder, not trained
                    if name in bufs:
                        trainer.runner.block_buffers.set_(*bufs[name], f.get_tensor(stored))
                        seen.add(name)
                        continue
                    if (layer := beyond(name)) is not None:
                        dropped.add(layer)
                        continue
                    held, idx = parts.get(name, (name, ()))
                    if held not in params or (name == held and held in n_parts):
                        if (tied and name == family(trainer.model.family).head_name) or name.endswith(_IGNORED_SUFFIXES):
                            continue  # a tied head saved anyway (it equals the embedding)
                        raise HorizonError(f"{d / fname}: unexpected tensor {name!r} (not a parameter of "
                                           f"{'a tied' if tied else 'an untied'} {trainer.model.name} model)")
                    dst = params[held][idx]
                    if stored in packed:  # 4-bit: dequantized, and kept packed where the run's base is nf4
                        pk = read_packed(f, stored, d / fname)
                        _check_shape(pk.shape, dst, name, d / fname)
                        dst.copy_(pk.dequantized())
                        if isinstance(params, _UnitSink):
                            params.give_packed(held, pk)
                    elif mx:  # gpt-oss's MXFP4 experts: dequantized into the master
                        with _pair(d, f, stored, stored + mxfp4.SCALES, shard_of) as both:
                            mxfp4.read(both, stored, d / fname, tuple(dst.shape), out=dst)
                        dequantized += 1
                    elif fp8_block and (stored + fp8.SCALE in here or stored + fp8.SCALE in shard_of):
                        with _pair(d, f, stored, stored + fp8.SCALE, shard_of) as both:
                            fp8.read(both, stored, d / fname, tuple(dst.shape), fp8_block, out=dst)
                        fp8_read += 1
                    else:
                        _read_plain(f, stored, name, dst, d / fname)
                    _check_finite(dst, name, d / fname)
                    if name not in seen and trainer.viewless_master:
                        n_parts[held] -= 1
                        if n_parts[held] <= 0:
                            params.filled(held)
                    seen.add(name)
        except HorizonError:
            raise
        except Exception as e:  # a truncated or corrupt file
            raise HorizonError(f"{d / fname}: cannot read ({type(e).__name__}: {e})") from None
    missing = [n for n in expected if n not in seen]
    if missing:
        raise HorizonError(f"{d}: tensor {missing[0]!r} is missing from the checkpoint"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    reset_optimizer_state(trainer)
    trainer.refresh_working_copy()
    trainer.weights.set_reference()  # full fine-tuning's DPO: the loaded weights are its reference
    notes = []
    if fp8_read:
        notes.append(f"{d}: {fp8_read} block-wise FP8 weights dequantized into the master (trained, and saved by "
                     "--save-hf, unquantized)")
    if dequantized:
        pol = trainer.policy
        master = "split fp32" if pol.split_master else pol.master_dtype
        notes.append(f"{d}: {dequantized} MXFP4 expert stacks dequantized into the {master} master "
                     "(trained, and saved by --save-hf, unquantized)")
    if dropped:
        notes.append(f"{d}: the tensors of layer(s) {', '.join(sorted(dropped, key=int))} beyond the model's "
                     f"{trainer.model.n_layers} blocks (DeepSeek-V3's multi-token-prediction module, which "
                     "transformers does not build) are not loaded, trained or saved")
    return notes


def extra_layers(m: ModelSpec):
    """name -> the layer (its number, a str) when it is a tensor of a layer past the model's
    blocks that a checkpoint of m's family may carry (ModelFamily.extra_layers: DeepSeek-V3's
    multi-token-prediction layer, model.layers.<n_layers>.*, which transformers ignores on load),
    else None; always None for every other family."""
    if not family(m.family).extra_layers:
        return lambda name: None
    prefix = family(m.family).layer_prefix

    def beyond(name: str) -> str | None:
        if not name.startswith(prefix):
            return None
        layer = name[len(prefix):].split(".", 1)[0]
        return layer if layer.isdigit() and int(layer) >= m.n_layers else None
    return beyond


def fp8_block_size(d: Path) -> tuple[int, int] | None:
    """The block of a folder whose config.json says its weights are block-wise FP8 (hf_fp8.py), else None."""
    q = (_read_config(d / "config.json").get("quantization_config") or {}) if (d / "config.json").is_file() else {}
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        return None
    return tuple(q.get("weight_block_size", [128, 128]))


@contextmanager
def _pair(d: Path, f, name: str, scales: str, shard_of: dict):
    """A quantized weight `name` and its scales `scales` as one reader (keys, get_tensor): from the
    open file f, or, when a sharded checkpoint put its scales in another shard, from that one too."""
    other = shard_of.get(scales)
    if other is None or scales in f.keys():
        yield f
        return
    from safetensors import safe_open
    with safe_open(str(d / other), framework="pt", device="cpu") as g:
        yield _Both(f, g)


class _Both:
    """Two open safetensors files read as one."""

    def __init__(self, f, g):
        self.f, self.g, self.in_f = f, g, set(f.keys())

    def keys(self):
        return [*self.in_f, *self.g.keys()]

    def get_tensor(self, name):
        return (self.f if name in self.in_f else self.g).get_tensor(name)


def _check_shape(shape, dst, name: str, where) -> None:
    if tuple(shape) != tuple(dst.shape):
        raise HorizonError(f"{where}: tensor {name!r} has shape {tuple(shape)}, the model needs {tuple(dst.shape)}")


def _read_plain(f, stored: str, name: str, dst, where) -> None:
    """dst <- a full-precision tensor of the open file f, its shape and dtype checked."""
    sl = f.get_slice(stored)
    _check_shape(sl.get_shape(), dst, name, where)
    if sl.get_dtype() not in ("F32", "BF16", "F16", "F64"):
        raise HorizonError(f"{where}: tensor {name!r} has dtype {sl.get_dtype()}; want a floating-point checkpoint "
                           "(or bitsandbytes' nf4, gpt-oss's MXFP4 experts, block-wise FP8)")
    dst.copy_(f.get_tensor(stored))   # one tensor read, cast to fp32 in place


def _check_finite(t, name: str, where) -> None:
    """A NaN or inf weight would make every loss and eval NaN: refused at load, naming it."""
    ok = torch.isfinite(t)
    if not bool(ok.all()):
        bad = (~ok).nonzero()
        first = bad[0].tolist()
        raise HorizonError(f"{where}: tensor {name!r} holds {bad.shape[0]} NaN or infinite value(s) (first at "
                           f"{first}: {t[tuple(first)].item()}); the weights must be finite")


class _UnitSink:
    """load_hf's destination for a master held other than as views (a split master, a quantized
    base: runtime/master.viewless_master): params[name] is a view into an fp32 scratch of its
    unit, made on first use; filled(name) counts the unit's tensors and, at its last, writes the
    scratch into the store through Master.write_whole (split, or packed) and drops it (a unit at a
    time for a checkpoint in layer order, never the whole model in fp32)."""

    def __init__(self, trainer):
        self.tr, self.unit_of, self.left, self.scratch = trainer, {}, {}, {}
        self.packed: dict = {}  # unit -> {block-relative name: nf4 regions} read packed (hf_bnb.py)
        for u in trainer.units:
            entries = host_layout(trainer.model, u).entries
            self.unit_of.update({e.name: u for e in entries})
            self.left[u] = len(entries)

    def __contains__(self, name) -> bool:
        return name in self.unit_of

    def __iter__(self):
        return iter(self.unit_of)

    def __getitem__(self, name):
        u = self.unit_of[name]
        if u not in self.scratch:
            lay = host_layout(self.tr.model, u)
            flat = torch.empty(lay.numel)
            self.scratch[u] = (flat, lay.views(flat))
        return self.scratch[u][1][name]

    def give_packed(self, name, pk) -> None:
        """Weight `name` arrived packed in nf4 (its scratch holds it dequantized): a quantized base
        keeps the bytes as they are rather than quantizing the scratch again."""
        u = self.unit_of[name]
        prefix = f"{family(self.tr.model.family).layer_prefix}{u}."
        if 0 <= u < self.tr.model.n_layers and name.startswith(prefix):  # a block
            self.packed.setdefault(u, {})[name.removeprefix(prefix)] = pk.regions

    def filled(self, name) -> None:
        u = self.unit_of[name]
        self.left[u] -= 1
        if not self.left[u]:
            self.tr.master.write_whole(u, self.scratch.pop(u)[0], packed=self.packed.pop(u, None))


def reset_optimizer_state(trainer) -> None:
    """Adam moments and step counters to zero, no pending pipelined update."""
    for b in trainer.sched.buffers.values():
        if b.name in trainer.store and b.holds in (Holds.MOMENTS, Holds.HOST_GRAD, Holds.GRAD_SQ, Holds.GRAD_NORM):
            trainer.store.t[b.name].zero_()
        elif b.space == Space.DISK and b.holds == Holds.MOMENTS:  # the disk tier's moments
            trainer.disk.zero(b.name)
    for s in trainer.store.steps.values():
        s.zero_()
    trainer.pending = False


def hf_config_dict(spec: ModelSpec, dtype: str, base: dict | None = None) -> dict:
    """config.json for a save: the source checkpoint's own config when given (it describes
    the same model, and keeps fields we do not model, like token ids; not a 4-bit source's
    quantization_config: the save is full precision), else hf_export's."""
    d = dict(base) if base is not None else to_hf_config_dict(spec)
    d.pop("quantization_config", None)  # a 4-bit source (hf_bnb.py) is saved in full precision
    if d.get("tie_word_embeddings", False) != spec.tied_embeddings:  # a distinct head kept (spec_from_hf_dir)
        d["tie_word_embeddings"] = spec.tied_embeddings
    d["torch_dtype"] = d["dtype"] = SAVE_DTYPES[dtype][1]  # transformers 4.x and 5.x names
    return d


def _shards(items, max_shard_bytes: int, itemsize: int):
    shards, cur, size = [], [], 0
    for name, t in items:
        n = t.numel() * itemsize
        if cur and size + n > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        shards.append(cur)
    return shards


def save_hf(trainer, path, dtype: str = "fp32", max_shard_bytes: int = DEFAULT_SHARD_BYTES,
            base_config: dict | None = None, side_files=(), carry=None) -> Path:
    """Write the trainer's master weights as a transformers checkpoint folder at `path`
    (pending pipelined updates are applied first; a run with adapters: the base with them merged,
    and the adapters alone in peft's format in its subfolder ADAPTER_DIR, peft_adapter.py). dtype: 'fp32' or 'bf16'. Shards of at
    most max_shard_bytes (a tensor larger than that gets a shard of its own). base_config:
    the source config.json to keep (see hf_config_dict); side_files: paths copied in
    (tokenizer files); carry: a multimodal checkpoint's hf_wrapped.Wrapped, whose language model
    the trainer holds: its tensors are saved under the checkpoint's names and every other tensor
    is copied from its folder as it is. The folder is built aside and renamed into place."""
    if dtype not in SAVE_DTYPES:
        raise HorizonError(f"save dtype {dtype!r}; allowed: {', '.join(SAVE_DTYPES)}")
    if max_shard_bytes <= 0:
        raise HorizonError(f"max shard size {max_shard_bytes} must be positive")
    out = Path(path)
    d = trainer.dist
    if carry is not None and d.rank == 0:
        carry.check_readable()
    if d.layout.nodes > 1 or trainer.viewless_master:  # every rank takes part in the gathers; the first one writes
        return _save_gathered(trainer, out, dtype, max_shard_bytes, base_config, side_files, carry)
    check_output_dir(out)
    trainer.flush()
    tdt = SAVE_DTYPES[dtype][0]
    adapters = trainer.adapters is not None
    sd = merged_state_dict(trainer) if adapters else trainer.state_dict()  # adapters: merged into the base
    items = stored_items(trainer.model, sd.items())  # MoE experts per expert (hf_experts.py)
    buffers = trainer.runner.block_buffers.items()  # non-parameter tensors, written in fp32
    items += buffers + (carry.items() if carry is not None else [])
    shards = _shards(items, max_shard_bytes, torch.empty((), dtype=tdt).element_size())
    with staging_dir(out) as tmp:
        _write_shards(tmp, shards, tdt, _carrying(lambda shard: shard, carry, True), carry,
                      fp32=frozenset(n for n, _ in buffers))
        _write_side(tmp, trainer, dtype, base_config, side_files)
        if adapters:  # and the adapters alone, in peft's format
            write_adapter(trainer, tmp / ADAPTER_DIR, (base_config or {}).get("_name_or_path") or None)
        publish_dir(tmp, out)
    return out


def _carrying(real, carry, writer: bool):
    """real(shard) for shards that also hold a multimodal checkpoint's carried tensors (carry:
    hf_wrapped.Wrapped, or None): the trainer's from real, in order, the carried read from
    their folder (by the writer only)."""
    if carry is None:
        return real

    def go(shard):
        got = iter(real([(n, t) for n, t in shard if not carry.is_carried(n)]))
        return [(n, carry.read(n) if carry.is_carried(n) else next(got)[1]) for n, _ in shard] if writer else list(got)
    return go


def _write_shards(tmp: Path, shards, tdt, real, carry=None, fp32=frozenset()) -> None:
    """The safetensors file(s) and, when sharded, the index; real(shard) gives a shard's
    [(name, tensor)] with data (a shard is planned from shapes alone). carry: a multimodal
    checkpoint's wrapping (hf_wrapped.Wrapped: the names written, the carried tensors' dtypes).
    fp32: names written in fp32 whatever tdt (a block's buffers, as transformers keeps them)."""
    def entries(pairs):
        if carry is None:
            return [(n, t, torch.float32 if n in fp32 else tdt) for n, t in pairs]
        return [(carry.saved_name(n), t, carry.saved_dtype(n, tdt)) for n, t in pairs]

    if len(shards) == 1:
        write_safetensors(tmp / SINGLE, entries(real(shards[0])), {"format": "pt"})
        return
    wmap, total = {}, 0
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(tmp / fname, entries(real(shard)), {"format": "pt"})
        for n, t, dt in entries(shard):
            wmap[n] = fname
            total += t.numel() * dt.itemsize
    write_text(tmp / INDEX, json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=2) + "\n")


def copied_side_file(f: Path) -> bool:
    """Whether a save copies the side file `f` (never one that would stand for its weights or config)."""
    return f.is_file() and f.name not in ("config.json", INDEX) and not f.name.endswith(".safetensors")


def _write_side(tmp: Path, trainer, dtype: str, base_config, side_files) -> None:
    """config.json and the side files: paths (copied now) or (name, contents) read earlier."""
    cfg = hf_config_dict(trainer.model, dtype, base_config)
    write_text(tmp / "config.json", json.dumps(cfg, indent=2) + "\n")
    for f in side_files:
        if isinstance(f, tuple):
            name, data = f
            if name not in ("config.json", INDEX) and not name.endswith(".safetensors") and "/" not in name:
                (tmp / name).write_bytes(data)
            continue
        f = Path(f)
        if copied_side_file(f):
            shutil.copyfile(f, tmp / f.name)


def _save_gathered(trainer, out: Path, dtype: str, max_shard_bytes: int, base_config, side_files, carry=None) -> Path:
    """save_hf of a run sharded over nodes, of a split master or of a quantized base (no process
    holds the fp32 master whole; adapters are merged into each unit as it is gathered): the shards are
    planned from the tensors' shapes, then shard by shard every rank gathers the units it
    needs (Trainer.gather_master, a collective) and rank 0 writes them; a unit is dropped once
    its tensors are written, so rank 0 holds at most a shard plus one unit, never the model.
    A write failure on rank 0 is raised after the gathers end (no rank is left waiting)."""
    d = trainer.dist
    writer = d.rank == 0
    trainer.flush()
    tdt = SAVE_DTYPES[dtype][0]
    adapters = trainer.adapters is not None
    unit_of, items = {}, []
    for u in trainer.units:
        for name, t in host_layout(trainer.model, u).views(torch.empty(host_layout(trainer.model, u).numel,
                                                                       device="meta")).items():
            unit_of[name] = u
            items.append((name, t))
    items = stored_items(trainer.model, items)  # MoE experts per expert: stored name -> (held name, index)
    held = {**{n: (n, ()) for n in unit_of}, **stored_parts(trainer.model)}
    remaining = dict.fromkeys(trainer.units, 0)
    for name, _ in items:
        remaining[unit_of[held[name][0]]] += 1
    buffers = dict(trainer.runner.block_buffers.items())  # every rank's own copy: no gather
    items += list(buffers.items()) + (carry.items() if carry is not None else [])
    shards = _shards(items, max_shard_bytes, torch.empty((), dtype=tdt).element_size())
    cache: dict = {}
    gathered = [0]  # shards whose units have been gathered

    def gather(shard):
        got = []
        for name, _ in shard:
            if name in buffers:
                got.append((name, buffers[name]))
                continue
            h, idx = held[name]
            u = unit_of[h]
            if u not in cache:
                cache[u] = host_layout(trainer.model, u).views(trainer.gather_master(u))
                if adapters and u in trainer.adapters.blocks:  # merged into the base (a quantized one)
                    cache[u].update(merged_unit(trainer, u, cache[u]))
            got.append((name, cache[u][h][idx]))
            remaining[u] -= 1
            if not remaining[u]:
                del cache[u]
        return got if writer else []

    inner = _carrying(gather, carry, writer)

    def real(shard):
        gathered[0] += 1
        return inner(shard)

    if not writer:
        for shard in shards:
            real(shard)
        return out
    try:
        check_output_dir(out)
        with staging_dir(out) as tmp:
            _write_shards(tmp, shards, tdt, real, carry, fp32=frozenset(buffers))
            _write_side(tmp, trainer, dtype, base_config, side_files)
            if adapters:  # and the adapters alone, in peft's format
                write_adapter(trainer, tmp / ADAPTER_DIR, (base_config or {}).get("_name_or_path") or None)
            publish_dir(tmp, out)
    except Exception:
        for shard in shards[gathered[0]:]:  # the other ranks wait in these gathers
            real(shard)
        raise
    return out


def check_output_dir(out: Path) -> None:
    """HorizonError unless `out` can be replaced by a saved checkpoint: absent, or a folder
    holding nothing but an HF checkpoint (it is replaced as a whole)."""
    if out.exists() and not out.is_dir():
        raise HorizonError(f"{str(out)!r} exists and is not a folder")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if not _checkpoint_file(p.name))
        if other:
            raise HorizonError(f"{str(out)!r} holds files that are not part of an HF checkpoint "
                               f"(e.g. {other[0]!r}); save to a new or checkpoint-only folder")


def _checkpoint_file(name: str) -> bool:
    return name in ("config.json", INDEX, ADAPTER_DIR, *SIDE_FILES) or name.endswith(".safetensors")


def model_side_files(path) -> list[Path]:
    """The model's own non-weight files of a checkpoint folder (generation config); the
    tokenizer's files come from the tokenizer a run uses (tokenize.HFTokenizer.files)."""
    if path is None:
        return []
    d = Path(path)
    return [d / n for n in MODEL_SIDE_FILES if (d / n).is_file()]
