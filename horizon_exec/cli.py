"""`horizon train`: run the executor on a text file.

    horizon train --model NAME|config.json --data FILE --steps N [policy flags] [--lr ...]

Tokens are the file's bytes (ids 0..255; the model's vocab must be >= 256). A progress bar
shows the loss and tokens/s; a summary with the device peak and host RSS is printed at the
end. This module must not import torch at import time: the `horizon` entry point imports it
to build its parser, and `horizon plan` must start fast.
"""
import argparse

from horizon_sim.cli.policy_args import add_policy_args, policy_from_args
from horizon_sim.errors import HorizonError


def configure_train_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = ("Train with the streaming executor: host RAM holds the fp32 master weights and "
                     "Adam state, the device streams one layer at a time, following the same "
                     "Schedule `horizon plan` simulates.")
    p.epilog = ("example:\n  horizon train --model tiny --steps 20 --batch 4 --seq 128\n"
                "  horizon train --model ./config.json --data corpus.txt --steps 100 --device cuda")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", required=True, help="preset name (e.g. tiny) or path to a config.json")
    p.add_argument("--data", default=None,
                   help="text file; its bytes are the tokens (default: the built-in corpus of "
                        "Python standard-library docstrings)")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    add_policy_args(p)
    p.add_argument("--loss-chunk-tokens", type=int, default=1024,
                   help="tokens per LM-head/loss chunk (default 1024)")
    o = p.add_argument_group("optimizer and run")
    o.add_argument("--lr", type=float, default=3e-4)
    o.add_argument("--weight-decay", type=float, default=0.0)
    o.add_argument("--beta1", type=float, default=0.9)
    o.add_argument("--beta2", type=float, default=0.95)
    o.add_argument("--eps", type=float, default=1e-8)
    o.add_argument("--seed", type=int, default=0, help="weight init and data order (default 0)")
    o.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    o.add_argument("--device-budget", default=None, metavar="SIZE",
                   help="device arena budget, e.g. 2GiB (default: unlimited)")
    o.add_argument("--compute-threads", type=int, default=None,
                   help="CPU backend: intra-op threads of the compute lane (default: cores - 1)")
    return p


def run_train(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from tqdm import tqdm

    from horizon_exec.data import BUILTIN_CORPUS, BYTE_VOCAB, RandomWindows, byte_tokens
    from horizon_exec.trainer import Trainer
    from horizon_sim.specs.hf_config import load_model
    from horizon_sim.units import fmt_bytes, parse_size

    model = load_model(args.model)
    if model.vocab < BYTE_VOCAB:
        raise HorizonError(f"model vocab {model.vocab} < {BYTE_VOCAB}: byte-level data needs at least 256 ids")
    if args.steps <= 0:
        raise HorizonError(f"--steps {args.steps} must be positive")
    policy = dataclasses.replace(policy_from_args(args), loss_chunk_tokens=args.loss_chunk_tokens)
    budget = parse_size(args.device_budget, "--device-budget") if args.device_budget else None
    data = RandomWindows(byte_tokens(args.data or BUILTIN_CORPUS), policy.batch, policy.seq, seed=args.seed)
    tr = Trainer(model, policy, lr=args.lr, weight_decay=args.weight_decay,
                 betas=(args.beta1, args.beta2), eps=args.eps, device=args.device, seed=args.seed,
                 device_budget_bytes=budget, compute_threads=args.compute_threads)
    print(f"horizon train: {model.name}, {model.total_params / 1e6:.1f}M params, {len(tr.sched)} ops/step, "
          f"host store {fmt_bytes(tr.host_store_bytes)}, device {args.device}")
    t0 = time.perf_counter()
    res = None
    with tr, tqdm(range(args.steps), unit="step") as bar:
        for _ in bar:
            res = tr.step(next(data))
            bar.set_postfix(loss=f"{res.loss:.4f}", tok_s=f"{res.tokens_per_s:,.0f}")
        tr.flush()
    wall = time.perf_counter() - t0
    print(f"final loss {res.loss:.4f}  grad norm {res.grad_norm:.3f}  "
          f"{args.steps * policy.tokens / wall:,.0f} tokens/s  device peak {fmt_bytes(res.device_peak_bytes)}  "
          f"peak RSS {fmt_bytes(res.rss_peak_bytes)}")
    return 0


# The `horizon` entry point calls every subcommand module's configure(parser) and run(args).
configure = configure_train_parser
run = run_train
