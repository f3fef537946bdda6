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
import os
import subprocess
import sys
from pathlib import Path

from horizon_exec.procfs import vm_hwm_bytes
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

ROOT = Path(__file__).resolve().parents[2]


def probe(model: ModelSpec, policy: Policy, *, steps: int = 3, warmup: int = 1, device: str = "cpu",
          seed: int = 0, timeout_s: float = 600.0, serialize: bool = False) -> dict:
    """Train `model` under `policy` for warmup + steps steps in a child process; return its
    measurements (see the module docstring). serialize: run one op at a time (lanes never
    overlap): calibrate's way to see each op's own cost."""
    req = {"model": model.to_dict(), "policy": policy.to_dict(), "steps": steps, "warmup": warmup,
           "device": device, "seed": seed, "serialize": serialize}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    try:
        out = subprocess.run([sys.executable, "-m", "horizon_exec.measure.probe"], input=json.dumps(req),
                             capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise HorizonError(f"probe of {model.name}: no result within {timeout_s:g} s") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise HorizonError(f"probe of {model.name} failed: {' | '.join(tail)}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _minor_faults() -> int:
    """Page faults this process took so far that needed no disk: first touches of memory the
    allocator got fresh from the kernel (a step that reuses its buffers takes few)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class _Serialized:
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
    """

    def __init__(self, model: ModelSpec, policy: Policy, *, warmup: int = 1, device: str = "cpu",
                 seed: int = 0, timeout_s: float = 600.0):
        self.req = {"model": model.to_dict(), "policy": policy.to_dict(), "warmup": warmup,
                    "device": device, "seed": seed, "serialize": False, "session": True}
        self.name, self.timeout_s = model.name, timeout_s
        self.proc = None
        self.final: dict = {}

    def __enter__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, "-m", "horizon_exec.measure.probe", "--session"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)
        self._send(self.req)
        return self

    def _send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read().strip().splitlines()[-3:]
            raise HorizonError(f"probe of {self.name} failed: {' | '.join(err) or 'no output'}")
        return json.loads(line)

    def start(self) -> None:
        """Wait until the child has built its trainer and run its warm-up steps."""
        assert self._recv()["ready"]

    def step(self) -> dict:
        self._send({"cmd": "step"})
        return self._recv()

    def __exit__(self, *exc):
        if self.proc is None:
            return
        try:
            if exc[0] is None:
                self._send({"cmd": "done"})
                self.final = self._recv()
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, HorizonError):
            self.proc.kill()
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()


def _sync_for(device: str):
    if device.startswith("cuda"):
        import torch
        return torch.cuda.synchronize
    return None


def _child(req: dict, commands=None) -> dict:
    """Run the request; with `commands` (a session's stdin), print 'ready' after warm-up, then
    one JSON line per 'step' command, and return at 'done'."""
    from horizon_exec.runtime.trainer import Trainer
    import torch

    model, policy = ModelSpec(**req["model"]), Policy(**req["policy"])
    rss0 = vm_hwm_bytes()
    gen = torch.Generator().manual_seed(req["seed"])
    out = {"steps": []}
    with Trainer(model, policy, device=req["device"], seed=req["seed"]) as tr:
        ser = None
        if req["serialize"]:
            ser = _Serialized(tr.engine.runner, _sync_for(req["device"]))
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
                    "rss_peak_bytes": vm_hwm_bytes(), "minor_faults": faults, "loss": res.loss,
                    "timeline": tl.to_dict(orient="list")}

        for _ in range(req["warmup"]):
            one_step()
        if commands is None:
            out["steps"] = [one_step() for _ in range(req["steps"])]
        else:
            print(json.dumps({"ready": True}), flush=True)
            for line in commands:
                if json.loads(line)["cmd"] != "step":
                    break
                print(json.dumps(one_step()), flush=True)
        # what the dynamic host buffers hold in RAM: the backend's pool (per size, the most
        # ever live at once), which is at least the buffers' concurrent peak
        out["host_dynamic_peak_bytes"] = int(max(tr.backend.pool.held_bytes, tr.buffers.host_peak))
        out["compute_threads"] = getattr(tr.backend, "compute_threads", None)
    out["rss_before_model_bytes"] = int(rss0)
    out["rss_peak_bytes"] = vm_hwm_bytes()
    return out


if __name__ == "__main__":
    if "--session" in sys.argv:
        first = sys.stdin.readline()
        final = _child(json.loads(first), commands=sys.stdin)
        final.pop("steps")
        print(json.dumps(final), flush=True)
    else:
        print(json.dumps(_child(json.loads(sys.stdin.read()))))
