from horizon_sim.schedule.builder import build_schedule
from horizon_sim.schedule.check import ScheduleError, check_schedule
from horizon_sim.schedule.eval_builder import build_eval_schedule
from horizon_sim.schedule.op import (
           EMBED,
           Buffer,
           Holds,
           Lane,
           Op,
           OpKind,
           ScheduleMeta,
           Space,
)
from horizon_sim.schedule.schedule import Schedule

__all__ = ["EMBED", "Buffer", "Holds", "Lane", "Op", "OpKind", "ScheduleMeta", "Space", "Schedule",
           "build_schedule", "build_eval_schedule", "ScheduleError", "check_schedule"]
