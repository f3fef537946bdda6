"""Run the real peer: DeepSpeed ZeRO-3 with parameters and optimizer offloaded to CPU, on
DeepSpeed's CPU accelerator (gloo, DeepSpeedCPUAdam), training a transformers model built from
a ModelSpec, in a process of its own (its own RSS peak, DeepSpeed's own environment).

    res = run_deepspeed(model, Zero3Policy(batch=2, seq=256), steps=4, warmup=1)
    res["steps"][i] = {"step_s", "loss", "rss_peak_bytes"}
    res["rss_peak_bytes"], res["threads"], res["deepspeed"] (version)

The Zero3Policy gives the DeepSpeed config (Zero3Policy.ds_config), so the planner's peer and
this run are one configuration. Data: random tokens from `seed`, or `tokens` (steps x batch x seq
token ids) for a parity check; `init_dir`: start from an HF folder instead of a random init;
`save_losses_only`: skip nothing, the losses are always reported.

`threads`: torch's (and DeepSpeedCPUAdam's OpenMP) threads in the child. DeepSpeed's first run in
an environment builds its CPU ops (cpu_adam, the shared-memory comm op) with ninja: a minute or
two, once, into extensions_dir() (`make setup` does it: prebuild()).
"""
import json
import os
import sys

from horizon_exec.dist.context import free_port
from horizon_exec.measure.child import run_json_child
from horizon_sim.errors import HorizonError
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.specs.model import ModelSpec


def deepspeed_available() -> str | None:
    """DeepSpeed's version when it is installed (without importing it: that takes seconds), else None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("deepspeed")
    except PackageNotFoundError:
        return None


def extensions_dir() -> str:
    """Where DeepSpeed's JIT-built CPU ops go: TORCH_EXTENSIONS_DIR when the user sets it, else a
    folder in this Python environment. torch's own default (~/.cache/torch_extensions) is one
    folder for every environment of the user, while the build files it holds name the
    environment's absolute paths: two checkouts each rebuilt the op (about two minutes) after the
    other had used it."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(sys.prefix, "torch_extensions")


def prebuild() -> None:
    """Build DeepSpeed's CPU Adam op into extensions_dir() now (make setup), not in the first run."""
    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    from deepspeed.ops.op_builder import CPUAdamBuilder
    CPUAdamBuilder().load()


def run_deepspeed(model: ModelSpec, zero3: Zero3Policy, *, threads: int | None = None, timeout_s: float = 900.0,
                  **run) -> dict:
    """Train warmup + steps steps of `model` under DeepSpeed ZeRO-3 offload in a child process
    and return what it measured (module docstring); `run`: run_request's keywords."""
    req = run_request(model, zero3, **run)
    return run_deepspeed_job({"runs": [req]}, threads, f"DeepSpeed run of {model.name}", timeout_s)["runs"][0]


def run_request(model: ModelSpec, zero3: Zero3Policy, *, steps: int = 4, warmup: int = 1, seed: int = 0,
                lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, tokens=None,
                init_dir: str | None = None, timeline: bool = False) -> dict:
    """One run of a job (run_deepspeed_job): the model, the peer's policy, steps and data;
    timeline: record the last step's (_Recorder) as "timeline" (records)."""
    return {"model": model.to_dict(), "zero3": zero3.to_dict(), "steps": steps, "warmup": warmup, "seed": seed,
            "lr": lr, "betas": list(betas), "eps": eps, "weight_decay": weight_decay, "tokens": tokens,
            "init_dir": init_dir, "timeline": timeline}


def deepspeed_adam_Gparams_per_s(params: int = 8 * 2**20, steps: int = 10, threads: int | None = None) -> float:
    """DeepSpeedCPUAdam's rate here (10^9 parameters a second; fp32 master, fp32 moments), timed
    in a child process like the runs: the peer's optimizer, for its plan."""
    job = {"adam": {"params": params, "steps": steps}}
    return run_deepspeed_job(job, threads, "DeepSpeedCPUAdam timing")["adam"]["Gparams_per_s"]


def run_deepspeed_job(req: dict, threads: int | None, what: str, timeout_s: float = 900.0) -> dict:
    """One child process (its own RSS peak; importing DeepSpeed costs seconds, once) that does
    req["runs"] (run_request each) one after another, each result with the process's RSS peak at
    its end, then times DeepSpeedCPUAdam if req["adam"] = {"params", "steps"}. Returns
    {"runs": [...], "adam": {"Gparams_per_s"}} as far as asked."""
    if deepspeed_available() is None:
        raise HorizonError("DeepSpeed is not installed: `make setup` installs the pinned version "
                           "(pip install 'deepspeed==0.19.8')")
    env = {"DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TORCH_EXTENSIONS_DIR": extensions_dir(),
           **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    return run_json_child("horizon_exec.measure.peer_deepspeed", req, what=what, env=env, timeout_s=timeout_s)


def _adam(req: dict) -> dict:
    import time

    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads())
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    n, steps = req["params"], req["steps"]
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-3
    opt = DeepSpeedCPUAdam([p], lr=1e-3, adamw_mode=True)
    opt.step()  # builds or loads the op, allocates the moments
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return {"Gparams_per_s": n * steps / (time.perf_counter() - t0) / 1e9}


def _job(job: dict) -> dict:
    import gc
    out = {"runs": []}
    for req in job.get("runs", ()):
        out["runs"].append(_child(req))
        gc.collect()
    if "adam" in job:
        out["adam"] = _adam(job["adam"])
    return out


def _child(req: dict) -> dict:
    import time

    import torch

    from horizon_exec.procfs import vm_hwm_bytes
    from horizon_sim.specs.hf_export import to_hf_config_dict
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()
    torch.set_num_threads(threads)
    import deepspeed
    import transformers
    # One process: DeepSpeed's shared-memory collective op (its CPU all-reduce between local
    # ranks) is never called, so it is not built (a fresh build costs half a minute)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from transformers import AutoConfig, AutoModelForCausalLM
    transformers.logging.set_verbosity_error()
    spec, zero3 = ModelSpec.from_dict(req["model"]), Zero3Policy.from_dict(req["zero3"])
    from horizon_exec.device import bf16_gemm
    if bf16_gemm.needed(zero3.compute_dtype):  # its bf16 GEMMs as Horizon's CPU backend computes them,
        bf16_gemm.acquire()                    # for this process's life: a comparison of the two is fair
    rss_runtime = vm_hwm_bytes()  # torch, transformers and DeepSpeed imported, no model yet
    torch.manual_seed(req["seed"])
    if req["init_dir"]:
        model = AutoModelForCausalLM.from_pretrained(req["init_dir"], dtype=torch.float32)
    else:
        d = to_hf_config_dict(spec)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d), dtype=torch.float32)
    model.config.use_cache = False
    if zero3.act_ckpt:  # transformers' per-layer checkpointing, as users turn it on under ZeRO-3
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cfg = zero3.ds_config()
    cfg["optimizer"]["params"].update(lr=req["lr"], betas=req["betas"], eps=req["eps"],
                                      weight_decay=req["weight_decay"])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    rec = _Recorder(engine.module, zero3) if req.get("timeline") else None
    gen = torch.Generator().manual_seed(req["seed"])
    given = req["tokens"]
    out = {"steps": [], "threads": threads, "deepspeed": deepspeed.__version__,
           "optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__}
    mb = zero3.micro_batch
    for i in range(req["warmup"] + req["steps"]):
        batch = (torch.tensor(given[i], dtype=torch.long) if given else
                 torch.randint(0, spec.vocab, (zero3.batch, zero3.seq), generator=gen))
        t0 = time.perf_counter()
        if rec:
            rec.begin(t0)
        losses = []
        for k in range(zero3.micro_batches):
            x = batch[k * mb:(k + 1) * mb]
            if rec:
                rec.micro = k
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            if rec and k == zero3.micro_batches - 1:
                rec.mark("optimizer", -1)
            engine.step()
            if rec and k == zero3.micro_batches - 1:
                rec.close_mark()
            losses.append(float(loss.detach()))
        step_s = time.perf_counter() - t0
        if i >= req["warmup"]:
            out["steps"].append({"step_s": step_s, "loss": sum(losses) / len(losses), "rss_peak_bytes": vm_hwm_bytes()})
    out["rss_peak_bytes"] = vm_hwm_bytes()
    out["rss_before_model_bytes"] = rss_runtime
    if rec:
        out["timeline"] = rec.events  # the last step's
    engine.destroy()
    return out


class _Recorder:
    """The last step's timeline of a DeepSpeed run, from module hooks (DeepSpeed records none),
    in horizon_sim.sim.timeline's terms: each decoder layer's forward, its recompute (a forward
    inside the backward, under checkpointing) and its backward, the LM head's forward and
    backward, and engine.step() on the last micro-batch (the optimizer). Everything runs in one
    thread on DeepSpeed's CPU accelerator; its fetches and offloads happen inside the gaps and
    inside these windows (its hooks run in the modules' hooks)."""

    def __init__(self, model, zero3):
        import time
        self.clock, self.t0, self.micro, self.events = time.perf_counter, 0.0, 0, []
        self.in_backward, self.starts, self.open = False, {}, None
        bwd_kind = "backward" if zero3.act_ckpt else "backward_saved"
        layers = model.model.layers
        for i, layer in enumerate(layers):
            self._hook(layer, i, bwd_kind)
        self._hook(model.lm_head, len(layers), "head")

    def _hook(self, mod, layer: int, bwd_kind: str) -> None:
        def pre(m, args):
            self.starts["f", layer] = self.clock()

        def post(m, args, out):
            kind = "head" if bwd_kind == "head" else "recompute" if self.in_backward else "forward"
            self._add(kind, layer, self.starts.pop(("f", layer)), self.clock())

        def bpre(m, grad_out):
            self.in_backward = True
            self.starts["b", layer] = self.clock()

        def bpost(m, grad_in, grad_out):
            self._add(bwd_kind, layer, self.starts.pop(("b", layer)), self.clock())
        mod.register_forward_pre_hook(pre)
        mod.register_forward_hook(post)
        mod.register_full_backward_pre_hook(bpre)
        mod.register_full_backward_hook(bpost)

    def begin(self, t0: float) -> None:
        self.t0, self.events, self.in_backward = t0, [], False

    def _add(self, kind: str, layer: int, start: float, end: float) -> None:
        lane = "cpu" if kind == "optimizer" else "compute"
        self.events.append({"op_id": len(self.events), "kind": kind, "lane": lane, "unit": layer,
                            "micro": self.micro, "start_s": start - self.t0, "end_s": end - self.t0,
                            "dur_s": end - start})

    def mark(self, kind: str, layer: int) -> None:
        self.open = (kind, layer, self.clock())

    def close_mark(self) -> None:
        kind, layer, start = self.open
        self._add(kind, layer, start, self.clock())
        self.in_backward = False


if __name__ == "__main__":
    result = _job(json.loads(sys.stdin.read()))
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # DeepSpeed's process group and threads: nothing is left to tear down
