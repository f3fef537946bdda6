"""`horizon train`: train with the streaming executor.

    horizon train --model NAME|config.json [--data FILE] --steps N [policy flags] [--lr ...]
    horizon train --init-from HF_DIR --data chat.jsonl --steps 1000 --save-hf out/ --ckpt-dir ckpt/

Policy: the flags given pin their knobs, the planner chooses the rest for this machine
(cli/train_policy.py; --no-search: the listed defaults; --job: the job's; --resume: the
checkpoint's). Data: a .jsonl file ("text", or "instruction"/"response" with the loss masked on the prompt)
or a text file, default the built-in corpus; tokens from --tokenizer tokenizer.json (or the
--init-from folder's), else bytes (ids 0..255). Schedule: linear warmup then cosine decay
to --min-lr. A progress bar shows loss, lr, tokens/s and MFU (peak from --gpu or
--hardware, else achieved model TFLOP/s). Periodic eval on held-out sequences, atomic
checkpoints to --ckpt-dir, exact --resume, and --save-hf writes a transformers checkpoint.
Reliability: a data-parallel launch is refused before any rank starts when the node cannot hold
it (node_admission.py: ranks vs cores unless --oversubscribe, ranks x per-rank footprint + the
shared store vs host RAM) or its rendezvous cannot happen (dist/rendezvous.py); the run is
refused up front (exit 2, needed vs available) when the planner says it does not fit the host
RAM (--host-budget, else MemAvailable) or the device (--device-budget, else CUDA free memory),
for a harmful flag (every flag is read once into a RunConfig whose types check it: cli/train_flags.py,
train/config.py, runtime/config.py; the data-parallel ones into a LaunchConfig: cli/launch_flags.py), or an output that cannot be written or has no room
(outputs.py; --ckpt-dir is locked by one run, ckpt_lock.py); a NaN/inf loss or gradient skips
the update (--on-nonfinite skip; all steps skipped: exit 1) or stops the run (stop, exit 1);
SIGINT/SIGTERM/SIGHUP finish the step, write a checkpoint and exit 130/143/129 (a second signal
aborts at once; the last complete checkpoint stays intact); a stuck step fails after
--op-timeout; an eval failure, a lane fault or a full disk is one line, exit 1; a closed stdout
drops the output, not the run; --resume verifies checksums and falls back to the previous
checkpoint when the latest is damaged.
This module must not import torch at import time: the `horizon` entry point imports it to
build its parser, and `horizon plan` must start fast.
"""
import argparse
import contextlib
import dataclasses
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from horizon_exec.device.core_split import threads_arg
from horizon_sim.cli.policy_args import add_policy_args
from horizon_sim.errors import HorizonError

if TYPE_CHECKING:  # (torch loads with them)
    from horizon_exec.cli.run_inputs import ModelAndTokenizer
    from horizon_exec.data.data import Dataset
    from horizon_exec.data.tokenize import ByteTokenizer, HFTokenizer
    from horizon_exec.train.config import RunConfig
    from horizon_exec.train.save import SaveInputs
    from horizon_sim.specs.hardware import HardwareSpec


def configure_train_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = ("Train with the streaming executor: host RAM holds the fp32 master weights and "
                     "Adam state, the device streams one layer at a time, following the same "
                     "Schedule `horizon plan` simulates. The policy flags you give pin their knobs; the "
                     "planner chooses the others: the fastest policy that fits this machine's device and RAM "
                     "(as `horizon tune --batch B --seq S` would; --no-search: their listed defaults).")
    p.epilog = ("examples:\n  horizon train --model tiny --steps 20 --batch 4 --seq 128\n"
                "  horizon train --model ./config.json --data corpus.txt --steps 100 --device cuda\n"
                "  horizon train --init-from ./Qwen2.5-0.5B --data sft.jsonl --steps 500 --batch 8 --seq 1024 \\\n"
                "      --lr 2e-5 --warmup-steps 20 --ckpt-dir ckpt --act-ckpt-every 100 --save-hf out --gpu h100-pcie\n"
                "  horizon train ... --ckpt-dir ckpt --resume      # continue from ckpt/latest, exactly")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", default=None,
                   help="preset name (e.g. tiny), path to a config.json, or a model id in the local HF cache "
                        "(default: --init-from's config)")
    p.add_argument("--steps", type=int, default=10, help="total optimizer steps of the run (default 10)")

    d = p.add_argument_group("data")
    d.add_argument("--data", default=None, metavar="FILE",
                   help=".jsonl ('text'; 'instruction' + 'response': loss on the response only; or "
                        "'messages': a chat rendered by the tokenizer's chat template, loss on the "
                        "assistant turns) or a text file (default: the built-in corpus of Python "
                        "standard-library docstrings)")
    d.add_argument("--tokenizer", default=None, metavar="tokenizer.json",
                   help="a local tokenizer.json or a folder holding one, a model id in the local HF "
                        "cache, or 'bytes' (UTF-8 bytes as ids 0..255) (default: the one in --init-from's "
                        "folder, which must then hold one; without --init-from, bytes); its files "
                        "(config, chat template) go into --save-hf")
    d.add_argument("--eos-token", default=None,
                   help="end-of-document token (default: tokenizer_config.json's, or a usual one)")
    d.add_argument("--eval-fraction", type=float, default=0.05,
                   help="share of the packed sequences held out for eval (default 0.05)")

    m = p.add_argument_group("weights in and out")
    m.add_argument("--init-from", default=None, metavar="HF_DIR",
                   help="start from a local HF checkpoint folder (config.json + safetensors, sharded or "
                        "not; llama, qwen2, mistral, qwen3), or a model id (org/name[@revision]) found in the "
                        "local HF cache (never downloaded), read tensor by tensor into the host store")
    m.add_argument("--init-adapter", default=None, metavar="DIR",
                   help="with --lora-rank: start the adapters from a peft LoRA adapter folder (adapter_config.json + "
                        "adapter_model.safetensors; its r, lora_alpha, target_modules and target_parameters must be the "
                        "run's)")
    m.add_argument("--save-hf", "--merge-into", dest="save_hf", default=None, metavar="DIR",
                   help="after training, write a transformers checkpoint folder (safetensors + config.json); "
                        "with --lora-rank the base with the adapters merged (hence --merge-into, the same flag), and "
                        "the adapters alone in peft's format in DIR/adapter; a symbolic link is followed (the save goes into its target); one run at a "
                        "time (.DIR.lock beside it names the holder)")
    m.add_argument("--save-adapter", default=None, metavar="DIR",
                   help="with --lora-rank: after training, write the adapters alone in peft's format "
                        "(adapter_config.json + adapter_model.safetensors; PeftModel.from_pretrained(base, DIR) "
                        "loads them), a few MB beside --save-hf's whole model")
    m.add_argument("--save-dtype", choices=("fp32", "bf16"), default="bf16",
                   help="dtype of the --save-hf weights (default bf16)")
    m.add_argument("--save-shard-size", default="5GB", metavar="SIZE",
                   help="largest safetensors shard of --save-hf (default 5GB)")

    add_policy_args(p, searched="; --no-search: {v}", compute_help="dtype of the device's matmuls and activations (default: bf16 on a GPU and on "
                                    "CPUs with bf16 matrix instructions, avx512_bf16/amx_bf16; fp32 on other CPUs, "
                                    "where bf16 GEMMs go through fp32 and a bf16 step runs slower)")
    from horizon_exec.cli.train_policy import add_search_args
    add_search_args(p)
    p.add_argument("--grad-accum", dest="micro_batches", type=int, default=argparse.SUPPRESS, metavar="N",
                   help="gradient accumulation: the same as --micro-batches N (the batch runs as N "
                        "micro-batches, gradients add up on the host; loss = token mean of the whole batch)")

    o = p.add_argument_group("optimizer and schedule")
    o.add_argument("--lr", type=float, default=3e-4, help="peak learning rate, in (0, 1] (default 3e-4)")
    o.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps (default 0)")
    o.add_argument("--min-lr", type=float, default=None,
                   help="cosine decay floor (default lr / 10)")
    o.add_argument("--weight-decay", type=float, default=0.0)
    o.add_argument("--beta1", type=float, default=0.9)
    o.add_argument("--beta2", type=float, default=0.95)
    o.add_argument("--eps", type=float, default=1e-8)
    o.add_argument("--seed", type=int, default=0, help="weight init and data order (default 0)")

    e = p.add_argument_group("eval, checkpoints, logging")
    e.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="eval loss every N steps (default 0: after the last step only)")
    e.add_argument("--eval-batches", type=int, default=4, metavar="N",
                   help="held-out batches per eval, 0 = no eval (default 4)")
    e.add_argument("--ckpt-dir", default=None, metavar="DIR",
                   help="write training checkpoints here (one run at a time: DIR/.lock names the holder)")
    e.add_argument("--save-every", "--ckpt-interval", dest="ckpt_interval", type=int, default=0, metavar="N",
                   help="checkpoint every N steps (default 0: after the last step only; --act-ckpt-every K "
                        "is the policy's activation-checkpoint interval, not this)")
    e.add_argument("--keep-ckpts", type=int, default=2, metavar="N",
                   help="checkpoints kept in --ckpt-dir, 0 = all (default 2)")
    e.add_argument("--overwrite-ckpt", action="store_true",
                   help="a fresh run (no --resume) in a --ckpt-dir that holds checkpoints removes them and "
                        "starts over (without it such a run is refused)")
    e.add_argument("--resume", nargs="?", const="", default=None, metavar="CKPT",
                   help="continue from a checkpoint folder (no value: --ckpt-dir's latest); the "
                        "resumed steps equal an uninterrupted run's")
    e.add_argument("--gpu", default=None, help="GPU preset whose peak FLOP/s MFU is reported against")
    e.add_argument("--hardware", default=None, metavar="FILE",
                   help="hardware TOML (e.g. from calibrate) whose peak FLOP/s MFU is reported against")
    e.add_argument("--log-file", default=None, metavar="FILE", help="append per-step metrics as JSON lines")
    e.add_argument("--report-dir", default=None, metavar="DIR",
                   help="write the run's predicted-vs-measured report here at the end (report.md, report.csv, "
                        "report.json, overlay.png; default: <ckpt-dir>/report with --ckpt-dir when the "
                        "prediction's speeds were measured on this machine, --hardware or a calibration; else none)")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")

    r = p.add_argument_group("device")
    r.add_argument("--device", default=None,
                   help="cpu or cuda[:N] (default: cuda when torch sees a GPU, else cpu; the run says which)")
    r.add_argument("--device-budget", default=None, metavar="SIZE",
                   help="device arena budget, e.g. 2GiB (default: unlimited)")
    r.add_argument("--disk-dir", default=None, metavar="DIR",
                   help="with --disk-tier moments: the folder (on local NVMe) for the disk tier's file; it is "
                        "unlinked at once and gone with the process, the checkpoints hold the moments "
                        "(default: the system temp dir)")
    r.add_argument("--disk-io", choices=("direct", "buffered"), default="direct",
                   help="how the disk tier reads and writes: O_DIRECT (default: the disk DMAs, nothing is "
                        "cached in RAM) or through the page cache, each unit dropped after use")
    r.add_argument("--compute-threads", type=threads_arg, default="auto", metavar="auto|N",
                   help="CPU backend: intra-op threads of the compute lane (default auto: all cores when the "
                        "step's lanes mostly idle, the lanes on them time-shared; else cores - the lanes' need; "
                        "priced with --hardware's measured thread scaling when given)")

    s = p.add_argument_group("reliability")
    s.add_argument("--host-budget", default=None, metavar="SIZE",
                   help="host RAM this run may use, e.g. 64GiB (default: MemAvailable + this process)")
    s.add_argument("--no-admission", action="store_true",
                   help="skip the up-front check that the run fits host RAM, device memory and the disk "
                        "space of its outputs (experts)")
    s.add_argument("--op-timeout", type=float, default=None, metavar="SECONDS",
                   help="a step with no op starting or finishing for this long fails as stuck instead of "
                        "hanging (default 120; raise it for very large models on the CPU backend). After a "
                        "first SIGINT/SIGTERM a stuck step is given up after 10 s")
    s.add_argument("--on-nonfinite", choices=("skip", "stop"), default=None,
                   help="a NaN/inf loss or gradient: skip the update (weights and optimizer state "
                        "unchanged) or stop the run (default skip; stop with --optimizer backward, "
                        "which cannot skip exactly)")
    from horizon_exec.cli.launch_flags import add_launch_args
    add_launch_args(p)
    from horizon_exec.cli.job_run import add_job_args
    add_job_args(p)  # last: every flag above then records whether it was given (a job's overrides)
    return p


def _peak_flops(cfg: "RunConfig", hardware: "HardwareSpec | None",
                compute_threads: int | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s of the compute dtype, where it came from) from --hardware (`hardware`, as
    loaded) or --gpu. A CPU backend's file gives its peak at the threads it was measured with
    (DeviceSpec.compute_threads); a run computing on `compute_threads` others is set against
    that many (a 1-thread file's peak put a 2-thread run at 132% MFU)."""
    compute_dtype = cfg.policy.compute_dtype
    if hardware is not None:
        dev = hardware.device
    elif cfg.gpu:
        from horizon_sim.specs.hardware_presets import device_preset
        dev = device_preset(cfg.gpu)
    else:
        return None, ""
    tf = dev.bf16_TFLOPs if compute_dtype == "bf16" else dev.fp32_TFLOPs
    what = f"{dev.name} {compute_dtype} peak {tf:g} TFLOP/s"
    if hardware is not None and dev.compute_threads and compute_threads and compute_threads != dev.compute_threads:
        tf *= compute_threads / dev.compute_threads
        what += f" x {compute_threads}/{dev.compute_threads} threads"
    return tf * 1e12, what


@contextlib.contextmanager
def _os_errors_as_usage():
    """A path the flags name that cannot be used (too long a name, a loop of links, no access)
    found while the run is set up: a usage error (exit 2) naming the path, not an error of
    the output."""
    from horizon_exec.checkpoints.fileio import os_error_text
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise
        raise HorizonError(f"cannot use {os.fsdecode(e.filename)!r}: {os_error_text(e).removesuffix(f' ({e.filename})')}") from None


def run_train(args: argparse.Namespace) -> int:
    from horizon_exec.cli.job_run import apply_job
    job = apply_job(args)  # --job: its values become the flags not given, before any is read
    from horizon_exec.cli import launch_flags
    from horizon_exec.dist import launch
    if launch.wants_launch(launch_flags.asked_ranks(args)):  # before torch loads: its C++ log level is read then (rendezvous.py)
        from horizon_exec.dist.rendezvous import quiet_cpp_logs
        quiet_cpp_logs()
    if args.device is None:  # the default: a GPU where torch sees one (a launch hands its ranks the choice)
        from horizon_exec.cli.default_device import default_device
        args.device, why = default_device()
        print(why)
    if args.device.startswith("cpu"):  # from before any torch work of this thread's (init, data)
        from horizon_exec.device.cpu import drive_on_one_thread
        drive_on_one_thread()
    if args.compute_dtype is None:  # before anything reads the policy (node admission, the ranks)
        from horizon_exec.device.compute_dtype import default_compute_dtype
        args.compute_dtype, args.compute_dtype_why = default_compute_dtype(args.device,
                                                                           master_dtype=args.master_dtype)
    if args.master_dtype is None:  # the default master: split where it can be, and the kernels it needs build
        from horizon_exec.device.default_master import default_master
        args.master_dtype = default_master(args.compute_dtype, not args.no_working_copy)
    from horizon_exec.model.xent import resolve_loss_kernel
    from horizon_sim.cli.explicit_flags import given as given_flags
    args.loss_kernel = resolve_loss_kernel(args.loss_kernel, args.device, "loss_kernel" in given_flags(args))
    from horizon_exec.cli.train_flags import run_config
    cfg = run_config(args)  # every flag checked, before anything is loaded
    launch_cfg = launch_flags.launch_config(args)
    from horizon_exec.train.outputs import follow_save_hf, prepare_outputs
    with _os_errors_as_usage():
        if cfg.outputs.save_hf:  # the save goes into a link's target, never replaces the link
            args.save_hf = follow_save_hf(cfg.outputs.save_hf)  # (the ranks of a launch read it too)
            cfg = dataclasses.replace(cfg, outputs=dataclasses.replace(cfg.outputs, save_hf=args.save_hf))
        init = None
        if cfg.init_from:  # a folder, or a model id in the HF cache: --save-hf must not replace it
            from horizon_exec.checkpoints.hf_checkpoint import resolve_checkpoint
            init = resolve_checkpoint(cfg.init_from)
    ck, out = cfg.checkpoints, cfg.outputs
    outputs = dict(ckpt_dir=ck.ckpt_dir, save_hf=out.save_hf, log_file=out.log_file, resume=ck.resume,
                   overwrite_ckpt=ck.overwrite_ckpt, init_from=init, save_adapter=out.save_adapter)
    read = None
    from horizon_exec.dist.context import launched
    if not launched():  # a single process, or the launcher before any rank starts (a rank: its launcher did)
        from horizon_exec.cli.run_inputs import check_run_inputs
        with _os_errors_as_usage():
            read = check_run_inputs(cfg, launch_cfg)
        if job is None and cfg.checkpoints.resume is None:  # a default --seq past GPT-2's positions: its context
            from horizon_sim.cli.policy_args import fit_seq_to_positions
            if fit_seq_to_positions(args, read.model):
                cfg = run_config(args)
        if job is None:  # the policy flags not given: the planner's choice (train_policy.py)
            cfg, read = _planned(args, cfg, read, launch_cfg)
        if job is not None:  # the job's prediction, and whether this Schedule is the job's
            job.check(cfg, read.model, launch_cfg)
    if launch.wants_launch(launch_cfg.ranks):  # outputs are checked here first: a bad one costs no process start
        from horizon_exec.cli.node_admission import check_node
        check_node(cfg, launch_cfg)  # the whole node's cores and RAM, before any rank starts
        if launch_cfg.node_rank == 0:
            with _os_errors_as_usage():
                prepare_outputs(**outputs)
        return launch.launch(launch_cfg, launch_flags.worker_args(args))
    from horizon_exec.dist.context import agree, from_env
    dist = from_env(cfg.trainer.runtime.device, launch_cfg.dist_timeout)
    if dist.rank:  # rank 0 speaks for the run; the others' errors still reach stderr
        cfg = dataclasses.replace(cfg, outputs=dataclasses.replace(cfg.outputs, progress=False))
        sys.stdout = open(os.devnull, "w")
    from horizon_exec.checkpoints import ckpt_lock
    save_lock = []

    def claim():  # rank 0: the outputs checked, and --save-hf this run's until it ends
        # --report-dir made now; the default one beside the checkpoints when written (cli/train_plan.py)
        prepare_outputs(**outputs, report_dir=cfg.outputs.report_dir if dist.world == 1 else None)
        if cfg.outputs.save_hf:
            save_lock.append(ckpt_lock.acquire_save(cfg.outputs.save_hf))
    with _os_errors_as_usage():
        agree(dist, lambda: claim() if dist.rank == 0 else None)
    rc = 1
    try:
        rc = _run_dist_rank(cfg, dist, read)
    finally:  # a clean end waits for every rank; a failed one does not wait for the others
        for key in save_lock:
            ckpt_lock.release(key)
        dist.close(wait=rc == 0)
    return rc


def _data_bytes(path, tok, policy) -> int:
    """Host bytes the run's data will hold at most: packed text, or preference pairs (two padded
    rows a record, data/pairs.py)."""
    if policy.objective == "dpo":
        from horizon_exec.data.pairs import pairs_bytes_bound
        return pairs_bytes_bound(path, policy.seq)
    from horizon_exec.data.data import data_bytes_bound
    return data_bytes_bound(path, tok, policy.seq)


def _load_data(data, tok, policy):
    """The run's Dataset: packed text, or preference pairs (DPO, data/pairs.py)."""
    if policy.objective == "dpo":
        from horizon_exec.data.pairs import load_pairs
        return load_pairs(data.data, tok, policy.seq, data.eval_fraction)
    from horizon_exec.data.data import load_dataset
    return load_dataset(data.data, tok, policy.seq, data.eval_fraction, doc_masks=policy.doc_masks)


def _planned(args: argparse.Namespace, cfg: "RunConfig", read: "ModelAndTokenizer", launch_cfg):
    """(`cfg` with the planner's policy for the knobs no flag pins, `read` with the machine
    description the search used) (cli/train_policy.py)."""
    from horizon_exec.cli.train_policy import choose_policy
    from horizon_sim.specs.layout import Layout
    try:
        layout = Layout(launch_cfg.nproc_per_node, launch_cfg.nnodes)
    except HorizonError:  # a launch this node cannot hold: check_node says so (before any rank starts)
        return cfg, read
    cfg, machine = choose_policy(args, cfg, read.model, _data_bytes(cfg.data.data, read.tok, cfg.policy), layout)
    return cfg, (dataclasses.replace(read, machine=machine) if machine is not None else read)


def _run_dist_rank(cfg: "RunConfig", dist, read=None) -> int:
    ck = cfg.checkpoints
    if not ck.ckpt_dir or not dist.is_leader:
        return _run_train(cfg, dist, read)
    from horizon_exec.checkpoints import ckpt_lock
    from horizon_exec.checkpoints.ckpt import node_folder
    from horizon_exec.checkpoints.fileio import make_dirs
    lock_dir = node_folder(ck.ckpt_dir, dist)
    make_dirs(Path(lock_dir))
    with ckpt_lock.holding(lock_dir):  # before anything is built: one run per folder
        if ck.overwrite_ckpt and ck.resume is None:  # checked up front (outputs.py): start over
            from horizon_exec.checkpoints.ckpt import remove_checkpoints
            gone = remove_checkpoints(lock_dir)
            if gone:
                print(f"--overwrite-ckpt: removed {len(gone)} checkpoint(s) of an earlier run from {lock_dir}")
        return _run_train(cfg, dist, read)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What the run read before its first step."""
    tok: "ByteTokenizer | HFTokenizer"
    init_dir: Path | None
    """The --init-from folder."""
    ds: "Dataset"
    peak: float | None
    """Peak FLOP/s MFU is reported against (None: achieved model TFLOP/s instead)."""
    peak_what: str
    save_inputs: "SaveInputs | None"
    """What --save-hf copies besides the weights (save.read_save_inputs), on the writing rank."""
    hardware: "HardwareSpec | None" = None
    """--hardware as loaded: the speeds the run's prediction simulates with (cli/train_plan.py)."""
    machine: object = None
    """This machine's description (measure/machine: --hardware, else the cached calibration or
    an estimate) the admission simulates on; None on a data-parallel rank without --hardware."""


def _machine(cfg: "RunConfig", hardware, dist, known=None):
    """The machine the run is planned on (measure/machine): --hardware as read, else (one
    process) the one the policy search used (`known`), else the cached calibration or a quick
    estimate; None for a data-parallel rank."""
    from horizon_exec.measure.machine import given_file, this_machine
    if hardware is not None:
        return given_file(hardware, cfg.hardware)
    if dist.world > 1:
        return None
    return known or this_machine(cfg.trainer.runtime.device, say=print)


def _run_train(cfg: "RunConfig", dist, read: "ModelAndTokenizer | None" = None) -> int:
    """read: the model and tokenizer as check_run_inputs read them (None: a rank reads them here)."""
    from horizon_exec.cli.run_inputs import read_model_and_tokenizer
    from horizon_exec.errors import ExecError
    from horizon_exec.checkpoints.fileio import OutputError
    from horizon_exec.train.loop import EvalError, Interrupted
    from horizon_exec.runtime.trainer import NonFiniteError, Trainer

    policy, data = cfg.policy, cfg.data
    # ---- model, tokenizer, data ------------------------------------------------------------
    with _os_errors_as_usage():  # a path the flags name that cannot be read: refused, named
        read = read or read_model_and_tokenizer(cfg)
        init_dir, model, tok = read.init_dir, read.model, read.tok
        for note in read.notes:
            print(note)
        # The data is loaded after the admission, which counts what it will hold (a bound from its size).
        data_bytes = _data_bytes(data.data, tok, policy)
        hardware = None
        if cfg.hardware:
            from horizon_sim.job.toml import load_hardware_or_job  # a hardware file, or a job's [hardware]
            hardware = load_hardware_or_job(cfg.hardware)  # its peak for MFU; its speeds and runtime overhead, for admission
        machine = _machine(cfg, hardware, dist, read.machine)
        save_inputs = None
        if cfg.outputs.save_hf and dist.rank == 0:  # what the save copies, read now: the source folders may change
            from horizon_exec.train.save import read_save_inputs
            save_inputs = read_save_inputs(cfg, tok, init_dir)

    # ---- trainer and loop ------------------------------------------------------------------
    adm = cfg.trainer.admission
    # the file's speeds: the admission's simulation, and what --compute-threads auto prices the split with
    adm = dataclasses.replace(adm, data_bytes=data_bytes, hardware=machine.hardware if machine else None)
    trainer_cfg = dataclasses.replace(cfg.trainer, admission=adm, runtime=_resumed_threads(cfg))
    tr = Trainer(model, policy, trainer_cfg, dist=dist)
    if trainer_cfg.runtime is not cfg.trainer.runtime:
        tr.backend.split_why = f"{tr.backend.compute_threads}, as the run being resumed (a GEMM sums in " \
                               f"another order on another count; --compute-threads N to choose)"
    peak, peak_what = _peak_flops(cfg, hardware, getattr(tr.backend, "compute_threads", None))
    with tr:
        if adm.enabled:
            from horizon_exec.train.save import check_space_for
            check_space_for(cfg, tr)
        ds = _load_data(data, tok, policy)
        try:
            return _train(cfg, tr, _Inputs(tok, init_dir, ds, peak, peak_what, save_inputs, hardware, machine))
        except Interrupted as e:  # every rank stopped at the same boundary: rank 0 says so for the run
            if tr.dist.rank == 0:
                print(f"horizon train: {e}" + ("; resume with --resume" if e.checkpoint else ""), file=sys.stderr)
            return e.exit_code
        except NonFiniteError as e:
            print(f"horizon train: stopped: {e}", file=sys.stderr)
            return 1
        except (OutputError, EvalError) as e:  # disk full, an eval that failed...: not a bad input
            print(f"horizon train: error: {e}", file=sys.stderr)
            return 1
        except ExecError as e:
            if os.environ.get("HORIZON_DEBUG"):
                traceback.print_exception(e.__cause__ or e, file=sys.stderr)
            print(f"horizon train: error: {e} (HORIZON_DEBUG=1 shows the traceback)", file=sys.stderr)
            return 1


def _resumed_threads(cfg: "RunConfig"):
    """The runtime config, with --compute-threads auto pinned to the compute threads the run
    being resumed used (its checkpoint records them): the planner's choice may differ today (a
    new calibration or estimate), and GEMMs sum in another order on another count, so the
    resumed steps would not equal the uninterrupted run's bit for bit. Unchanged otherwise."""
    rt, ck = cfg.trainer.runtime, cfg.checkpoints
    if ck.resume is None or rt.device != "cpu" or rt.compute_threads != "auto":
        return rt
    from horizon_exec.checkpoints.ckpt import recorded_compute_threads
    from horizon_exec.device.cpu import cpu_cores
    threads = recorded_compute_threads(ck.resume or ck.ckpt_dir)
    if threads is None or threads > len(cpu_cores()):  # an older checkpoint, or a bigger machine's
        return rt
    return dataclasses.replace(rt, compute_threads=threads)


def _train(cfg: "RunConfig", tr, inputs: _Inputs) -> int:
    from horizon_exec.cli.train_plan import plan_for
    from horizon_exec.train.loop import TrainLoop

    check, plan_line = plan_for(cfg, tr, inputs.machine, inputs.ds)  # the run set against its own plan
    with TrainLoop(tr, inputs.ds, cfg.loop_config(inputs.peak), seed=cfg.trainer.seed, check=check) as loop:
        return _run_loop(cfg, tr, loop, inputs, plan_line)


def _run_loop(cfg: "RunConfig", tr, loop, inputs: _Inputs, plan_line: str = "") -> int:
    from horizon_exec.checkpoints import hf_checkpoint
    from horizon_exec.dtypes import TORCH_DTYPE
    from horizon_sim.units import fmt_bytes

    model, policy, ds, peak = tr.model, tr.policy, inputs.ds, inputs.peak
    print(f"horizon train: {model.name}, {model.total_params / 1e6:.1f}M params, {len(tr.sched)} ops/step, "
          f"host store {fmt_bytes(tr.host_store_bytes)}, device {cfg.trainer.runtime.device}"
          + (f", {tr.dist.world} ranks ({tr.dist.layout}), a step trains "
             f"{policy.batch * tr.dist.world} sequences" if tr.dist.world > 1 else ""))
    what = "pairs (a chosen and a rejected row each)" if policy.objective == "dpo" else "sequences"
    print(f"data: {ds.source}, tokenizer {inputs.tok.name}, {ds.n_tokens:,} tokens -> {len(ds.train)} train + "
          f"{len(ds.eval)} eval {what} of {policy.seq}")
    if tr.admission is not None:
        print(f"admission: fits: {tr.admission.line()}")
    why = cfg.compute_dtype_why
    print(f"compute: {policy.compute_dtype}" + (f" by default: {why}" if why else ""))
    if tr.backend.split_why:  # the CPU backend's core split (--compute-threads)
        print(f"cores: {tr.backend.split_why}")
    if tr.adapters is not None:
        from horizon_sim.schedule import work
        n = sum(t.shape[1] for t in tr.adapters.state.values())
        print(f"adapters: LoRA rank {policy.lora_rank}, alpha {policy.lora_alpha:g}"
              + (f", dropout {policy.lora_dropout:g}" if policy.lora_dropout else "") + " on "
              f"{', '.join(sorted({work.target_name(p) for p in tr.adapters.modules}))}: {n:,} parameters, "
              + ("fp32 with their AdamW moments on the device, updated after the backward" if policy.adapters_on == "device"
                 else "fp32 with their AdamW moments in host RAM (each block's cross with its weights), updated on the "
                      "host after the backward") + "; the base frozen in "
              f"{policy.base_form} on the host" + (f"; {policy.objective_text}" if policy.objective_text else ""))
    else:
        master = "split fp32 master (bf16 copy + low half)" if policy.split_master else f"{policy.master_dtype} master"
        disk = f" on disk ({tr.disk.method} I/O in {tr.disk.folder})" if tr.disk is not None else ""
        print(f"optimizer: AdamW ({policy.optimizer}), {master}, {policy.states_dtype} moments{disk}: "
              f"{tr.runner.adamw.describe(TORCH_DTYPE[policy.master_dtype], TORCH_DTYPE[policy.states_dtype])}")
        if policy.objective_text:
            print(f"objective: {policy.objective_text}")
    ck = cfg.checkpoints
    if ck.resume is not None:
        p = loop.resume(ck.resume or ck.ckpt_dir)
        print(f"resumed from {p} at step {loop.step}")
        if inputs.init_dir is not None:  # the same command line plus --resume is how a run is continued: not an error
            print(f"--init-from {cfg.init_from}: its config, tokenizer and side files are used; the weights "
                  f"and optimizer state come from the checkpoint")
        if cfg.init_adapter is not None:
            print(f"--init-adapter {cfg.init_adapter}: not read; the adapters and their state come from the checkpoint")
    else:
        if inputs.init_dir is not None:
            notes = hf_checkpoint.load_hf(tr, inputs.init_dir)
            print(f"weights from {inputs.init_dir}")
            for note in notes:
                print(note)
        if cfg.init_adapter is not None:
            from horizon_exec.checkpoints.peft_adapter import load_adapter
            load_adapter(tr, cfg.init_adapter)
            print(f"adapters from {cfg.init_adapter}")
    if inputs.peak_what:
        print(f"MFU against {inputs.peak_what}")
    if inputs.machine is not None:  # where the machine's speeds come from (and the offer to calibrate)
        from horizon_exec.measure.machine import lines
        for line in lines(inputs.machine):
            print(line)
    if plan_line:
        print(plan_line)
    from horizon_exec.cli.train_plan import finish
    from horizon_exec.train.loop import Interrupted
    try:
        res = loop.run()
    except Interrupted as e:  # stopped at a step boundary: the steps that ran are still compared
        if not e.immediate:
            finish(cfg, tr, loop.check, strict=False)
        raise
    save_hf = cfg.outputs.save_hf
    if res is None:
        for line in _no_step_summary(cfg, loop):
            print(line)
    else:
        ev = loop.evals.get(loop.step)
        rate = f"{loop.tokens_per_s:,.0f} tokens/s"
        rate += (f"  MFU {100 * loop.model_flops_per_s / peak:.3g}%" if peak else
                 f"  {loop.model_flops_per_s / 1e12:.3g} model TFLOP/s")
        print(f"final loss {res.loss:.4f}" + (f" (router aux {res.aux_loss:.4f})" if res.aux_loss is not None else "")
              + (f"  eval loss {ev:.4f}" if ev is not None else "")
              + f"  grad norm {res.grad_norm:.3f}  {rate}  device peak {fmt_bytes(res.device_peak_bytes)}"
              f"  peak RSS {fmt_bytes(res.rss_peak_bytes)}")
    if loop.untargeted:
        print(f"{len(loop.untargeted)} of {loop.steps_run} step(s) had a batch with no target token (loss 0, "
              f"nothing trained): {', '.join(map(str, loop.untargeted[:20]))}"
              f"{' ...' if len(loop.untargeted) > 20 else ''}")
        if len(loop.untargeted) == loop.steps_run:  # every loss 0 and nothing learnt: not a success
            print(f"horizon train: error: no batch of this run ({loop.steps_run} step(s)) had a target token, so "
                  f"nothing was trained" + (" (--save-hf not written)" if save_hf else "")
                  + f"; with instruction data, prompts longer than --seq {policy.seq} leave no response token "
                  f"to train on: raise --seq or shorten the prompts", file=sys.stderr)
            return 1
    if loop.skipped:
        print(f"{len(loop.skipped)} step(s) skipped for a non-finite loss or gradient: "
              f"{', '.join(map(str, loop.skipped[:20]))}{' ...' if len(loop.skipped) > 20 else ''}")
        if len(loop.skipped) == loop.steps_run:  # nothing was learnt: not a success, nothing to publish
            print(f"horizon train: error: every step of this run ({loop.steps_run}) was skipped for a "
                  f"non-finite loss or gradient, so the weights never changed"
                  + (" (--save-hf not written)" if save_hf else "")
                  + "; lower --lr or check the data and the initial weights", file=sys.stderr)
            return 1
    if save_hf:
        from horizon_exec.dist.context import agree
        from horizon_exec.train.save import save_hf as write_hf
        tr.flush()  # every rank (a collective when pending): the master is final
        # one node: rank 0 writes from the shared store; several: every rank gathers, rank 0 writes
        agree(tr.dist, lambda: write_hf(cfg, tr, loop, inputs.save_inputs)
              if tr.dist.rank == 0 or tr.dist.layout.nodes > 1 else None)
    if cfg.outputs.save_adapter and tr.dist.rank == 0:  # the adapters are alike on every rank
        from horizon_exec.checkpoints.peft_adapter import save_adapter
        with _os_errors_as_usage():
            saved = save_adapter(tr, cfg.outputs.save_adapter, cfg.init_from)
        print(f"saved the adapters (peft's format) to {saved}")
    finish(cfg, tr, loop.check)  # measured vs predicted, and the report (after the weights are safe)
    return 0


def _no_step_summary(cfg: "RunConfig", loop) -> list[str]:
    """What a run resumed with no step left did, for the lines a finished run ends with: at its
    last step, the final eval its checkpoint did not hold (run now: loop.eval_redone) and
    --save-hf (written next) are what the killed run had left; the final loss and grad norm
    are the checkpoint's record of its step (loop.resumed_last; absent in older checkpoints)."""
    step = loop.step
    if step != cfg.steps:  # a checkpoint beyond --steps: nothing of this run is left
        return [f"nothing to do: the run is at step {step} of {cfg.steps}"]
    done = []
    if loop.eval_redone == step:
        done.append("ran the final eval its checkpoint did not hold")
    elif step in loop.evals:
        done.append("its final eval is in the checkpoint")
    if cfg.outputs.save_hf:
        done.append(f"writes --save-hf {cfg.outputs.save_hf}")
    lines = [f"the run was at its last step ({step} of {cfg.steps}): " + ("; ".join(done) or "nothing left to do")]
    last, ev = loop.resumed_last or {}, loop.evals.get(step)
    nums = ([f"final loss {last['loss']:.4f}"] if last.get("loss") is not None else []) \
        + ([f"eval loss {ev:.4f}"] if ev is not None else []) \
        + ([f"grad norm {last['grad_norm']:.3f}"] if last.get("grad_norm") is not None else [])
    if nums:
        lines.append("  ".join(nums) + f" (step {step}; no step ran in this process)")
    return lines


# The `horizon` entry point calls every subcommand module's configure(parser) and run(args).
configure = configure_train_parser
run = run_train
KEEP_RUNNING_WITHOUT_STDOUT = True  # progress lines are not the product (stdout_guard.py)


if __name__ == "__main__":  # a worker of a data-parallel run (dist/launch.py), or plain torchrun -m
    from horizon_exec.dist.context import exit_rank
    from horizon_exec.dist.launch import ARGS_ENV
    from horizon_sim.cli.main import main
    if os.environ.get(ARGS_ENV):  # the launching `horizon train`'s arguments, as it parsed them
        import json
        exit_rank(main(args=argparse.Namespace(**json.loads(os.environ[ARGS_ENV]))))
    exit_rank(main(["train", *sys.argv[1:]]))
