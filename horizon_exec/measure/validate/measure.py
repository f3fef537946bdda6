"""Measuring the configurations: each runs in a process of its own (probe.Session), so each RSS
peak is its own, and they are measured interleaved, a few steps of each in turn (PER_TURN, each
turn after one unmeasured step), so all of them sample the machine over the same stretch of time.
"""


PER_TURN = 2
"""Measured steps a configuration runs per turn, after one unmeasured step: a process that sat
idle while the others ran starts its first step with cold caches (and a CPU that has dropped
its clock), which a training run stepping back to back never sees."""


def measure(configs, *, steps: int = 6, warmup: int = 1, device: str = "cpu", say=None,
            between=None) -> list[dict]:
    """Run every configuration in its own process, interleaved: all children start and warm
    up together (not measured), then turn after turn each runs one unmeasured step and up to
    PER_TURN measured ones while the others wait, so all configurations sample the machine over
    the same stretch of time. `between()`, when given, runs before the first turn and after
    each, while every child waits (the drift references). Returns, per configuration, the
    probe's measurements (steps, store bytes, RSS peak...)."""
    from contextlib import ExitStack
    from horizon_exec.measure.probe import Session
    results = [{"steps": []} for _ in configs]
    with ExitStack() as stack:
        sessions = [stack.enter_context(Session(c.model, c.policy, warmup=warmup, device=device,
                                                       ranks=c.ranks))
                    for c in configs]
        for s in sessions:
            s.start()
        turns = -(-steps // PER_TURN)
        if say:
            say(f"validate: {len(configs)} configurations started and warmed up; measuring {steps} steps "
                f"each, in {turns} interleaved turns")
        if between:
            between()
        for t in range(turns):
            n = min(PER_TURN, steps - t * PER_TURN)
            for res, s in zip(results, sessions):
                # back up to speed after waiting for the others; every op's temporaries measured
                # (the device peak; the measured steps after it replay them: their times are
                # what training runs at)
                res.setdefault("tracked_steps", []).append(s.step(track=True))
                res["steps"] += [s.step() for _ in range(n)]
            if between:
                between()
    for res, s in zip(results, sessions):
        res.update(s.final)
    return results
