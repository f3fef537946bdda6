"""A Job from what the planner decided: the model as given, the machine, the policy and the
simulated step (a SimResult); the training side at `horizon train`'s defaults.

    r, split = plan_policy(model, hw, policy)      # as `horizon plan` prices it
    job = job_from_plan(source="tiny", model=model, hardware=hw, result=r, split=split)
"""
from horizon_sim.job.digest import model_digest, planner_version, schedule_digest
from horizon_sim.job.sections import Job, ModelSection, PredictionSection
from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def plan_policy(model: ModelSpec, hw: HardwareSpec, policy: Policy, compute_threads=None):
    """(SimResult, CoreSplit or None): one step of `policy` on `hw` priced as `horizon plan`
    prices it (a calibrated CPU file at the core split `horizon train` would pick)."""
    from horizon_sim.plan.core_split import priced_for_split
    from horizon_sim.plan.plan import build_for
    from horizon_sim.sim.extend import MIN_SAMPLE, extended, with_micro_batches
    from horizon_sim.sim.simulate import simulate, simulate_policy
    if extended(model, policy):  # many micro-batches: the split is priced on a few, only those built
        priced, split = priced_for_split(build_for(model, with_micro_batches(policy, MIN_SAMPLE), hw), hw,
                                         compute_threads)
        return simulate_policy(model, policy, priced), split
    sched = build_for(model, policy, hw)
    priced, split = priced_for_split(sched, hw, compute_threads)
    return simulate(sched, priced), split


def prediction_of(result: SimResult, split=None) -> PredictionSection:
    s = result.summary
    sched = result.schedule
    if result.extension is not None:  # the digest is of the step's own Schedule, not of a count simulated
        from horizon_sim.schedule import build_schedule
        sched = build_schedule(sched.meta.model, result.policy, sched.meta.layout)
    return PredictionSection(step_time_s=float(s.step_time_s), tokens_per_s=float(s.tokens_per_s),
                             device_peak_bytes=int(s.device_peak_bytes), host_bytes=int(s.host_bytes),
                             bottleneck=str(s.bottleneck), fits=bool(s.fits),
                             compute_threads=None if split is None else int(split.compute_threads),
                             schedule_digest=schedule_digest(sched), planner_version=planner_version())


def job_from_plan(*, source: str, model: ModelSpec, hardware: HardwareSpec, result: SimResult, split=None) -> Job:
    """The job of a planned step. `hardware`: the machine as given (not the one priced at a
    core split); `result`: its simulated step, whose Schedule holds the resolved policy."""
    policy = result.policy
    return Job(model=ModelSection(source=source, name=model.name, params=int(model.total_params),
                                  digest=model_digest(model)),
               policy=policy, prediction=prediction_of(result, split), hardware=hardware)
