"""What `horizon train` reads before it builds anything, and the usage errors found there: the
model spec, the tokenizer (it must fit the model's vocab), the data file (it exists and can be
read), --disk-tier (one process only) and --resume (a checkpoint is there).

check_run_inputs runs in the process the user started, before anything is built: in a single
process, and in the data-parallel launcher before any rank starts. Found inside the ranks, such
an error came once per rank after torch's launcher banner and a rank start (issue 43); here it is
one line, exit 2. The ranks of a launch read the model and tokenizer again (they need them), with
the same function: what the launcher refused never reaches them.
Paths that cannot be used raise OSError: the caller makes it a usage error naming the path
(train_cmd._os_errors_as_usage).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from horizon_sim.errors import HorizonError

if TYPE_CHECKING:  # (torch loads with them)
    from horizon_exec.data.tokenize import ByteTokenizer, HFTokenizer
    from horizon_exec.dist.launch import LaunchConfig
    from horizon_exec.train.config import RunConfig
    from horizon_sim.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class ModelAndTokenizer:
    init_dir: Path | None
    """The --init-from folder."""
    model: "ModelSpec"
    tok: "ByteTokenizer | HFTokenizer"
    notes: tuple[str, ...]
    """What the run says about them (stdout, once the run starts)."""
    machine: object = None
    """This machine's description (measure/machine) once the policy search read it: the run
    plans on the same one, without reading (or measuring) it again."""


def read_model_and_tokenizer(cfg: "RunConfig") -> ModelAndTokenizer:
    """The model and tokenizer of the run; HorizonError for a tokenizer that cannot be used with it."""
    from horizon_exec.checkpoints import hf_checkpoint
    from horizon_exec.checkpoints.hf_wrapped import wrapped
    from horizon_exec.data.tokenize import BYTES, load_tokenizer, resolve_tokenizer, tokenizer_of_folder
    from horizon_exec.model.families import check_runnable
    from horizon_sim.specs.hf_config import load_model

    data, notes = cfg.data, []
    init_dir = hf_checkpoint.resolve_checkpoint(cfg.init_from) if cfg.init_from else None
    if init_dir is not None:
        run = hf_checkpoint.run_model(init_dir, cfg.model)
        model = run.spec
        if run.overridden:  # a context extension, say: the point of giving both
            notes.append(f"--model {cfg.model}: its {', '.join(run.overridden)} replace(s) --init-from "
                         f"{cfg.init_from}'s (same shapes); --save-hf writes the config trained with")
        if (wrap := wrapped(init_dir)) is not None:
            notes.append(f"--init-from {cfg.init_from}: a multimodal {wrap.model_type} checkpoint: its language model "
                         f"({model.total_params:,} parameters) trains; the other {wrap.carried_params:,} (vision tower, "
                         "projector) are not loaded, and --save-hf copies them unchanged from that folder")
        if run.untied_head:
            notes.append(f"--init-from {cfg.init_from}: tie_word_embeddings is true but lm_head.weight differs from "
                         "the embedding: trained untied, as transformers loads it (--save-hf writes tie false)")
    else:
        model = load_model(cfg.model)
    check_runnable(model)  # a block the template does not run: refused before any allocation
    dropped = _dropout_fields(hf_checkpoint.base_config(init_dir, cfg.model) or {})
    if dropped:  # GPT-2's configs keep 0.1: said, not refused (every such checkpoint would be)
        notes.append(f"config: {', '.join(f'{k} {v:g}' for k, v in dropped)}: Horizon trains without dropout "
                     "(the values stay in --save-hf's config)")
    if data.tokenizer == BYTES:
        tok_path = None
    elif data.tokenizer:
        tok_path = resolve_tokenizer(data.tokenizer)
    else:
        tok_path = tokenizer_of_folder(init_dir) if init_dir is not None else None
        if init_dir is not None and tok_path is None:  # pretrained weights on byte ids: silently useless
            raise HorizonError(f"--init-from {cfg.init_from}: the folder has no tokenizer.json; give the "
                               f"tokenizer the model was trained with (--tokenizer FILE|DIR), or --tokenizer "
                               f"{BYTES} to train it on UTF-8 byte ids")
    if tok_path is None and data.eos_token is not None:  # the byte tokenizer's end of document is fixed
        raise HorizonError(f"--eos-token {data.eos_token!r} needs a tokenizer (--tokenizer, or one in the "
                           f"--init-from folder); the byte tokenizer has no end-of-document token to choose")
    tok = load_tokenizer(tok_path, data.eos_token)
    if tok.vocab_size > model.vocab:
        raise HorizonError(f"tokenizer {tok.name} has {tok.vocab_size} ids; the model's vocab is {model.vocab}")
    return ModelAndTokenizer(init_dir, model, tok, tuple(notes))


def _dropout_fields(config: dict) -> list[tuple[str, float]]:
    """The config's dropout probabilities above zero (resid_pdrop, attention_dropout, ...)."""
    return [(k, float(v)) for k, v in sorted(config.items()) if ("dropout" in k or k.endswith("_pdrop"))
            and k != "classifier_dropout" and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]


def check_run_inputs(cfg: "RunConfig", launch: "LaunchConfig") -> ModelAndTokenizer:
    """Every usage error the run's inputs hold (module docstring), before anything is built or
    any rank starts; the model and tokenizer read, for a single process to train with."""
    read = read_model_and_tokenizer(cfg)
    _check_data(cfg, read.tok)
    _check_disk_tier(cfg, launch)
    _check_resume(cfg, launch)
    return read


def _check_data(cfg: "RunConfig", tok) -> None:
    from horizon_exec.data.data import BUILTIN_CORPUS, data_bytes_bound
    data_bytes_bound(cfg.data.data, tok, cfg.policy.seq)  # a regular file that is there, else refused by name
    with open(cfg.data.data or BUILTIN_CORPUS, "rb"):     # and this user may read it (OSError: named)
        pass


def _check_disk_tier(cfg: "RunConfig", launch: "LaunchConfig") -> None:
    """The disk tier runs in one process (the planner's schedule refuses a shared one:
    horizon_sim/schedule/declare.py); said here in the train command's flags."""
    tier = cfg.policy.disk_tier
    if tier != "none" and launch.ranks > 1:
        raise HorizonError(f"--disk-tier {tier} runs in one process for now, not --nproc-per-node "
                           f"{launch.nproc_per_node} x --nnodes {launch.nnodes}: drop --disk-tier, or train "
                           "with one process")


def _check_resume(cfg: "RunConfig", launch: "LaunchConfig") -> None:
    """--resume needs a checkpoint to try: the folder the run's resume reads (train/loop.py:
    with several nodes, this node's node-J folder) holds a step folder, or is one. Whether it
    is intact is the resume's to find (it falls back to older ones)."""
    ck = cfg.checkpoints
    if ck.resume is None:
        return
    from horizon_exec.checkpoints.ckpt import META, candidates
    path = Path(ck.resume or ck.ckpt_dir)
    if launch.nnodes > 1 and not path.name.startswith("node-"):
        path = path / f"node-{launch.node_rank}"
    if not candidates(path):
        raise HorizonError(f"--resume: no checkpoint in {str(path)!r} (want a step-N folder with {META}, or a "
                           f"checkpoint folder holding one)" + (f"; --ckpt-dir {ck.ckpt_dir} holds none yet: "
                                                                "drop --resume to start the run" if not ck.resume
                                                                else ""))
