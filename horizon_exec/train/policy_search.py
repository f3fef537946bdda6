"""The planner's policy for a run (issue 39, item 4): the fastest that fits the memory the run
may use, with the knobs the user set pinned (plan/pinned.py, the space `horizon tune` searches).
`horizon train` without a full policy trains it (cli/train_policy.py says what it chose); the
benchmarks' Horizon side runs it when given no policy flags.

The machine: `hardware` (a calibration, a file or an estimate: its speeds) with the admission's
budgets (runtime/admission.py budgets: --host-budget, else MemAvailable + this process;
--device-budget, else CUDA's free memory, else none) less what the training data will hold; on
the CPU backend the device is host RAM, and the planner counts it there (plan/outcome.py)."""
from collections.abc import Iterable
from dataclasses import dataclass

from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


@dataclass(frozen=True)
class PlannedPolicy:
    policy: Policy | None
    """The fastest policy that fits; None when nothing in the space does."""
    result: object
    """The search (plan/tune.py TuneResult): its table's first row is `policy`'s prediction."""
    hardware: HardwareSpec
    """The machine searched on: the speeds, with the run's budgets as its memories."""


def plan_policy(model: ModelSpec, policy: Policy, given: Iterable[str], hardware: HardwareSpec | None, *,
                device: str = "cpu", host_budget_bytes: int | None = None, device_budget_bytes: int | None = None,
                data_bytes: int = 0, layout=None) -> PlannedPolicy:
    """Search the knobs no flag in `given` (argparse dests) pins, under `policy`'s batch,
    sequence, precisions and clipping (module docstring). A data-parallel launch on GPUs
    (`layout` of several ranks) takes the device memory from `hardware` (or the budget): asking
    CUDA would create a context in the launcher that holds device memory while its ranks run."""
    from horizon_exec.runtime.admission import budgets, machine_with_budgets, unrunnable_moves
    from horizon_sim.plan.pinned import pinned_space
    from horizon_sim.plan.runner import Runner
    from horizon_sim.plan.tune import tune

    if device != "cpu" and layout is not None and layout.ranks > 1:
        (host, _), _ = budgets("cpu", host_budget_bytes)
        dev = device_budget_bytes or int(hardware.device_bytes_usable)
    else:
        (host, _), (dev, _) = budgets(device, host_budget_bytes, device_budget_bytes)
    hw = machine_with_budgets(hardware, None if host is None else max(host - data_bytes, 0), dev, layout)
    space = pinned_space(policy, given, n_layers=model.n_layers, batch=policy.batch,
                         no_split="split master" in unrunnable_moves())
    with Runner(workers=1) as runner:  # a small model's search is ~100 simulations: no process pool to start
        res = tune(model, hw, policy.seq, base=policy, space=space, runner=runner)
    return PlannedPolicy(res.best, res, hw)
