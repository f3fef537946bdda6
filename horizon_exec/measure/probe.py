"""Run one configuration of the executor in a fresh Python process and report what it measured,
so every configuration gets its own process-wide RSS peak (ru_maxrss never goes down) and none
inherits another's warmed caches or allocator state.

    res = probe(model, policy, steps=4, warmup=1)       # runs `python -m horizon_exec.measure.probe`
    res["steps"][i] = {"step_s", "device_peak_bytes", "rss_peak_bytes", "timeline": [...]}
    (rss: the child's own VmHWM, see vm_hwm_bytes)
    res["store_bytes"], res["host_dynamic_peak_bytes"], res["rss_before_model_bytes"]

The child reads a JSON request on stdin and prints one JSON line on stdout. It imports only
what `horizon train` needs to run a step (torch, the executor, the planner's schedule), so the
runtime overhead `horizon calibrate` measures with it is the one a training process carries.
"""
import json
import subprocess
import sys

from horizon_exec.dist.context import free_port
from horizon_exec.measure.child import ROOT, child_env, run_json_child
from horizon_exec.procfs import node_rss_bytes, rss_shmem_bytes, vm_hwm_bytes
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware_io import hardware_to_toml
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def probe(model: ModelSpec, policy: Policy, *, steps: int = 3, warmup: int = 1, device: str = "cpu",
          seed: int = 0, timeout_s: float = 600.0, serialize: bool = False, compute_threads=None,
          hardware=None) -> dict:
    """Train `model` under `policy` for warmup + steps steps in a child process; return its
    measurements (see the module docstring). serialize: run one op at a time (lanes never
    overlap): calibrate's way to see each op's own cost. compute_threads: the CPU backend's
    (RuntimeConfig's: N, 'auto', or None, cores - 1: the split a hardware file's rates are
    for, what calibrate and validate compare against); hardware: the HardwareSpec 'auto'
    prices with."""
    req = {"model": model.to_dict(), "policy": policy.to_dict(), "steps": steps, "warmup": warmup,
           "device": device, "seed": seed, "serialize": serialize, "compute_threads": compute_threads,
           "hardware": hardware_to_toml(hardware) if hardware is not None else None}
    return run_json_child("horizon_exec.measure.probe", req, what=f"probe of {model.name}", timeout_s=timeout_s)


def _minor_faults() -> int:
    """Page faults this process took so far that needed no disk: first touches of memory the
    allocator got fresh from the kernel (a step that reuses its buffers takes few)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Serialized:
    """Wraps the engine's op runner so that one op runs at a time across all lanes, and
    records each op's own duration (lock wait excluded)."""

    def __init__(self, runner, sync=None):
        import threading
        import time
        self.runner, self.lock, self.clock = runner, threading.Lock(), time.perf_counter
        self.sync = sync  # CUDA: wait for the op's kernels, or only their launch is timed
        self.durations: dict[int, float] = {}

    def __call__(self, op):
        with self.lock:
            if self.sync:
                self.sync()
            t0 = self.clock()
            self.runner(op)
            if self.sync:
                self.sync()
            self.durations[op.id] = self.clock() - t0


class Session:
    """One configuration in a child process that steps on demand, so several configurations
    can be measured interleaved (one step of each in turn): every configuration then samples
    the machine over the same stretch of time, and a slow spell of a shared machine does not
    land on one configuration only. Only one child runs a step at a time; the others wait on
    their pipe (their lane threads block, using no CPU).

        with Session(model, policy, warmup=1) as s:   # starts the child, builds the trainer
            s.start()                                  # ...waits until it has warmed up
            r = s.step()                               # one measured step (same fields as probe)
        s.final  # store_bytes, host_dynamic_peak_bytes, rss_peak_bytes, ...

    ranks > 1: a data-parallel node of that many processes on this machine (gloo over
    loopback, the env:// variables a launcher sets, one node store they share), each with its
    own command pipe; every command goes to all of them. A step's time is the slowest rank's,
    its timeline rank 0's, its device peak the largest rank's, its RSS the node's
    (procfs.node_rss_bytes: private peaks plus the shared store once); each rank trains its own
    random batch of `policy.batch` sequences.
    """

    def __init__(self, model: ModelSpec, policy: Policy, *, warmup: int = 1, device: str = "cpu",
                 seed: int = 0, timeout_s: float = 600.0, ranks: int = 1):
        if not isinstance(ranks, int) or ranks < 1:
            raise HorizonError(f"ranks={ranks!r} must be a positive integer")
        self.req = {"model": model.to_dict(), "policy": policy.to_dict(), "warmup": warmup,
                    "device": device, "seed": seed, "serialize": False, "session": True}
        self.name, self.timeout_s, self.ranks = model.name, timeout_s, ranks
        self.procs: list = []
        self.final: dict = {}

    def __enter__(self):
        env = child_env()
        port = free_port() if self.ranks > 1 else 0
        for r in range(self.ranks):
            if self.ranks > 1:
                env = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(self.ranks),
                           LOCAL_WORLD_SIZE=str(self.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            self.procs.append(subprocess.Popen([sys.executable, "-m", "horizon_exec.measure.probe", "--session"],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               text=True, env=env, cwd=ROOT))
        self._send(self.req)
        return self

    def _send(self, obj) -> None:
        for p in self.procs:
            p.stdin.write(json.dumps(obj) + "\n")
            p.stdin.flush()

    def _recv(self) -> list[dict]:
        out = []
        for r, p in enumerate(self.procs):
            line = p.stdout.readline()
            if not line:
                err = p.stderr.read().strip().splitlines()[-3:]
                who = f" (rank {r} of {self.ranks})" if self.ranks > 1 else ""
                raise HorizonError(f"probe of {self.name}{who} failed: {' | '.join(err) or 'no output'}")
            out.append(json.loads(line))
        return out

    def start(self) -> None:
        """Wait until the child has built its trainer and run its warm-up steps."""
        assert all(r["ready"] for r in self._recv())

    def step(self, track: bool = False) -> dict:
        """One step; track=True measures every op's temporaries in it (RuntimeConfig.track_memory:
        a dense model's ops are otherwise measured once and replayed), so its device peak is
        measured, not replayed, and its time carries the tracker's cost."""
        self._send({"cmd": "step", "track": track})
        return _node_step(self._recv())

    def __exit__(self, *exc):
        ok, err = exc[0] is None, None
        for p in self.procs:  # every child hears 'done' before any is waited on: they finish together
            try:
                if ok:
                    p.stdin.write(json.dumps({"cmd": "done"}) + "\n")
                    p.stdin.flush()
            except OSError:
                ok = False
        if ok:
            try:
                self.final = _node_final(self._recv())
            except HorizonError as e:
                ok, err = False, e
        for p in self.procs:
            try:
                p.stdin.close()
                p.wait(timeout=30 if ok else 0.1)
            except (OSError, subprocess.TimeoutExpired):
                p.kill()
                p.wait()
            finally:
                p.stdout.close()
                p.stderr.close()
        if err is not None and exc[0] is None:
            raise err


def _node_step(replies: list[dict]) -> dict:
    """One step of a node's ranks as one measurement (Session's docstring)."""
    if len(replies) == 1:
        return replies[0]
    out = dict(replies[0])
    out["step_s"] = max(r["step_s"] for r in replies)
    out["device_peak_bytes"] = max(r["device_peak_bytes"] for r in replies)
    out["rss_peak_bytes"] = node_rss_bytes([r["rss_peak_bytes"] for r in replies],
                                           [r["rss_shmem_bytes"] for r in replies])
    out["minor_faults"] = sum(r["minor_faults"] for r in replies)
    return out


def _node_final(replies: list[dict]) -> dict:
    out = dict(replies[0])
    if len(replies) > 1:
        out["rss_peak_bytes"] = node_rss_bytes([r["rss_peak_bytes"] for r in replies],
                                               [r["rss_shmem_bytes"] for r in replies])
        out["host_dynamic_peak_bytes"] = sum(r["host_dynamic_peak_bytes"] for r in replies)
        out["ranks"] = len(replies)
    return out


def sync_for(device: str):
    """What waits for `device`'s queued work before a clock is read (None: the CPU runs it in order)."""
    if device.startswith("cuda"):
        import torch
        return torch.cuda.synchronize
    return None


def _child(req: dict, commands=None) -> dict:
    """Run the request; with `commands` (a session's stdin), print 'ready' after warm-up, then
    one JSON line per 'step' command, and return at 'done'."""
    from horizon_exec.dist.context import from_env
    from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    import torch

    model, policy = ModelSpec.from_dict(req["model"]), Policy.from_dict(req["policy"])
    rss0 = vm_hwm_bytes()
    ctx = from_env(req["device"])  # a Session of several ranks set the launcher's variables
    gen = torch.Generator().manual_seed(req["seed"] + ctx.rank)
    out = {"steps": []}
    from horizon_exec.runtime.config import AdmissionConfig
    import tomllib
    from horizon_sim.specs.hardware_io import hardware_from_dict
    hw = hardware_from_dict(tomllib.loads(req["hardware"])) if req.get("hardware") else None
    cfg = TrainerConfig(runtime=RuntimeConfig(device=req["device"], compute_threads=req.get("compute_threads")),
                        admission=AdmissionConfig(hardware=hw), seed=req["seed"])
    with Trainer(model, policy, cfg, dist=ctx) as tr:
        ser = None
        if req["serialize"]:
            ser = Serialized(tr.engine.runner, sync_for(req["device"]))
            tr.engine.runner = ser
        out["store_bytes"] = int(tr.host_store_bytes)

        def one_step() -> dict:
            tokens = torch.randint(0, model.vocab, (policy.batch, policy.seq), generator=gen)
            faults0 = _minor_faults()
            res = tr.step(tokens)
            faults = _minor_faults() - faults0
            tl = res.timeline
            if ser is not None:
                tl["own_s"] = [ser.durations.get(int(i), float("nan")) for i in tl.op_id]
            return {"step_s": res.step_s, "device_peak_bytes": int(res.device_peak_bytes),
                    "rss_peak_bytes": vm_hwm_bytes(), "rss_shmem_bytes": rss_shmem_bytes(),
                    "minor_faults": faults, "loss": res.loss,
                    "timeline": tl.to_dict(orient="list")}

        for _ in range(req["warmup"]):
            one_step()
        if commands is None:
            out["steps"] = [one_step() for _ in range(req["steps"])]
        else:
            print(json.dumps({"ready": True}), flush=True)
            for line in commands:
                cmd = json.loads(line)
                if cmd["cmd"] != "step":
                    break
                if cmd.get("track"):
                    tr.runner.retrack()
                print(json.dumps(one_step()), flush=True)
        # what the dynamic host buffers hold in RAM: the backend's pool (per size, the most
        # ever live at once), which is at least the buffers' concurrent peak
        out["host_dynamic_peak_bytes"] = int(max(tr.backend.pool.held_bytes, tr.buffers.host_peak))
        out["compute_threads"] = getattr(tr.backend, "compute_threads", None)
        out["split_why"] = tr.backend.split_why
        out["rss_shmem_bytes"] = rss_shmem_bytes()  # while the node store is still mapped
    ctx.close()
    out["rss_before_model_bytes"] = int(rss0)
    out["rss_peak_bytes"] = vm_hwm_bytes()
    return out


if __name__ == "__main__":
    if "--session" in sys.argv:
        first = sys.stdin.readline()
        final = _child(json.loads(first), commands=sys.stdin)
        final.pop("steps")
        print(json.dumps(final), flush=True)
        from horizon_exec.dist.context import exit_rank
        exit_rank(0)
    else:
        print(json.dumps(_child(json.loads(sys.stdin.read()))))
