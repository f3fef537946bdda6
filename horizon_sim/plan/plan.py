"""plan(): build the schedule for (model, policy) and simulate it on the hardware."""
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import SimResult, simulate
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def plan(model: ModelSpec | str, hardware: HardwareSpec | None = None, policy: Policy | None = None,
         *, gpu: str = "h100-sxm", ram: str | int = "512GiB", link: str | None = None) -> SimResult:
    """Predict one training step. `model` is a ModelSpec, a preset name or a config.json path;
    give `hardware`, or `gpu`/`ram`/`link` preset names and a RAM size."""
    spec = load_model(model) if isinstance(model, str) else model
    hw = hardware or make_hardware(gpu, ram, link)
    return simulate(build_schedule(spec, policy or Policy()), hw)
