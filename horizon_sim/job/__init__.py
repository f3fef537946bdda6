"""One job from plan to run (docs/job.md): `horizon plan|simulate|tune --save-job JOB.toml` writes
a job file (the model, the machine, every policy field resolved, the training side, the
prediction and the Schedule's digest); `horizon train --job JOB.toml` trains it.

sections.py: the job's sections, frozen dataclasses checked when made; toml.py: the file, written
atomically and read back with one-line errors naming the file and the key; digest.py: the model's
and the Schedule's digests; build.py: a job from a planned step; cli.py: the planner commands'
--save-job and the `horizon train` lines they print. Torch-free, like all of horizon_sim."""
from horizon_sim.job.sections import Job
from horizon_sim.job.toml import job_to_toml, read_job, write_job

__all__ = ["Job", "job_to_toml", "read_job", "write_job"]
