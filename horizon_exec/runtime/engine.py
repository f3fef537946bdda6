"""The engine: runs a Schedule's ops on lanes, in program order, never re-deriving the order.

One persistent worker thread per lane, each fed a FIFO queue. `run(ops)` walks the ops in
program order and puts each on its lane's queue; a worker takes the next op, waits (host side)
until every op in `deps` is done, lets the backend order its device work after theirs (CUDA:
stream waits on events), marks start, runs the op, marks end and flags it done. Ops that are
not run this time (a pipelined optimizer's prev_step ops on a run's first step) count as done.

Failures: the first exception in any lane aborts the step (the others skip what is left) and
`run` raises ExecError naming the op, its lane and the cause. Waits poll every POLL_S. A step
is stuck when no op has started or finished for `timeout_s` (the op timeout: the longest a
single op may take, as lanes waiting on it make no progress either); it is then reported as
an ExecError naming what each lane is in, not a hang. A stop request (request_stop(): the
training loop's first SIGINT/SIGTERM, which otherwise lets the step finish) shortens that to
STOP_GRACE_S, so a signal ends a stuck step (StepAbandoned).
The caller hears of a failure within POLL_S + ABORT_GRACE_S (under a second) even when another
lane is inside a long op: lanes that have not drained by then are left to finish on their own
and the engine is marked broken (unusable), since they may still touch the step's buffers.
An exception raised in the calling thread while it waits (KeyboardInterrupt, a signal
handler's) aborts the lanes the same way and propagates.
"""
import queue
import threading
import time
from dataclasses import dataclass, field

from horizon_exec.errors import ExecError
from horizon_sim.cli import stuck_threads
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Lane, Op

POLL_S = 0.05
"""Period of every wait (dependencies, lane joins): how soon an abort or a timeout is noticed."""
ABORT_GRACE_S = 0.5
"""After a failure, how long `run` waits for the other lanes to drain before raising anyway."""
DEFAULT_OP_TIMEOUT_S = 120.0
"""Default op timeout: a GPU op (or a host optimizer update of a 120B model's layer) takes
seconds; two minutes without any op starting or finishing is a hang. The CPU backend running
a large model may need more (RuntimeConfig(timeout_s=...), horizon train --op-timeout)."""
STOP_GRACE_S = 10.0
"""After a stop request, how long a step may go without progress before it is abandoned."""
_STOP = object()
RUN_LANES = (Lane.H2D, Lane.COMPUTE, Lane.D2H, Lane.CPU)
"""The lanes of one device's step; a data-parallel step adds Lane.FABRIC and Lane.NET (each
with its own worker and process groups: horizon_exec/dist/context.py)."""


class StepAbandoned(ExecError):
    """A stop was requested and the step made no progress for STOP_GRACE_S: it was abandoned
    (the engine is unusable, a lane is still inside its op)."""


@dataclass(slots=True)
class _Rec:
    done: threading.Event = field(default_factory=threading.Event)
    t0: object = None
    t1: object = None
    ran: bool = False


@dataclass(slots=True)
class _End:
    event: threading.Event = field(default_factory=threading.Event)


class _Aborted(Exception):
    pass


class Engine:
    def __init__(self, backend, runner, timeout_s: float = DEFAULT_OP_TIMEOUT_S, lanes=RUN_LANES):
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise HorizonError(f"op timeout {timeout_s!r} must be a positive number of seconds")
        self.backend = backend
        self.runner = runner
        self.timeout_s = timeout_s
        self.lanes = tuple(lanes)
        self._progress_t = time.monotonic()   # when an op last started or finished, any lane
        self._in_op: dict[Lane, float | None] = {lane: None for lane in self.lanes}  # since when, running
        self._stop_t: float | None = None
        self.hook = None  # called in the lane thread before each op (tests, tracing)
        self._queues = {lane: queue.SimpleQueue() for lane in self.lanes}
        self._current: dict[Lane, Op | None] = {lane: None for lane in self.lanes}
        self._abort = threading.Event()
        self._error: tuple[Op, BaseException] | None = None
        self._error_t = 0.0  # when _error was set (monotonic)
        self._err_lock = threading.Lock()
        self.broken: str | None = None
        self._threads = [threading.Thread(target=self._worker, args=(lane,), daemon=True,
                                          name=f"horizon-{lane.value}") for lane in self.lanes]
        for t in self._threads:
            t.start()

    # ---- lane worker ----------------------------------------------------------------------
    def _worker(self, lane: Lane) -> None:
        init_error = None
        try:
            self.backend.start_lane(lane)
        except BaseException as e:  # reported on the lane's first op
            init_error = e
        q = self._queues[lane]
        while True:
            item = q.get()
            if item is _STOP:
                return
            if isinstance(item, _End):
                item.event.set()
                continue
            op, recs = item
            rec = recs[op.id]
            self._current[lane] = op
            try:
                if init_error is not None:
                    raise init_error
                if self._abort.is_set():
                    raise _Aborted
                for d in op.deps:
                    self._wait_dep(op, recs, d)
                self.backend.wait_device(lane, [recs[d].t1 for d in op.deps if recs[d].ran])
                self._progress_t = self._in_op[lane] = time.monotonic()
                if self.hook is not None:
                    self.hook(op)
                rec.t0 = self.backend.mark(lane)
                self.runner(op)
                rec.t1 = self.backend.mark(lane)
                rec.ran = True
            except _Aborted:
                pass
            except BaseException as e:
                self._fail(op, e)
            finally:
                self._current[lane] = self._in_op[lane] = None
                self._progress_t = time.monotonic()
                rec.done.set()

    def _wait_dep(self, op: Op, recs, d: int) -> None:
        """Until op d is done; no deadline of its own: a dependency behind a long queue is not a
        hang as long as some lane progresses (the caller watches that, _join_lane)."""
        ev = recs[d].done
        while not ev.wait(POLL_S):
            if self._abort.is_set():
                raise _Aborted
        if self._abort.is_set():
            raise _Aborted

    # ---- stop requests ----------------------------------------------------------------------
    def request_stop(self) -> None:
        """A stop was asked for (e.g. the first SIGTERM; safe to call from a signal handler): the
        running step still finishes, unless it makes no progress for STOP_GRACE_S."""
        self._stop_t = time.monotonic()

    def clear_stop(self) -> None:
        self._stop_t = None

    def _fail(self, op: Op, e: BaseException) -> None:
        with self._err_lock:
            if self._error is None:
                self._error = (op, e)
                self._error_t = time.monotonic()
        self._abort.set()

    # ---- driving a step ---------------------------------------------------------------------
    def run(self, ops, n_ids: int, skip=frozenset()) -> list[tuple[Op, float, float]]:
        """Run `ops` (program order) minus `skip`; ids run over 0..n_ids-1 (ops absent from
        the list count as done). Returns (op, start_s, end_s) for the ops that ran."""
        if self.broken:
            raise ExecError(f"the engine is unusable: {self.broken}")
        recs = [_Rec() for _ in range(n_ids)]
        to_run = [op for op in ops if op.id not in skip]
        running = {op.id for op in to_run}
        for i, r in enumerate(recs):
            if i not in running:
                r.done.set()
        self._abort.clear()
        self._error = None
        self._progress_t = time.monotonic()  # the time between steps is not a stall
        self.backend.step_begin()
        for op in to_run:  # program order; each lane is FIFO
            self._queues[op.lane].put((op, recs))
        ends = {lane: _End() for lane in self.lanes}
        for lane, end in ends.items():
            self._queues[lane].put(end)
        try:
            for lane, end in ends.items():
                self._join_lane(lane, end)
                if self.broken:
                    break
        except ExecError:
            raise
        except BaseException as e:  # the caller was interrupted: stop the lanes, then propagate
            self._abort.set()
            if self._drain(ends, f"the step was interrupted ({type(e).__name__})"):
                try:  # device work the lanes queued ends before the caller frees its buffers
                    self.backend.step_end()
                except BaseException:
                    pass  # the interruption is what the caller hears about
            raise
        if self.broken:  # a lane failed and another did not drain in time
            op, e = self._error
            raise ExecError(f"op {op.id} {op.label} on lane {op.lane.value} failed: {type(e).__name__}: {e} "
                            f"({self.broken})", op=op) from e
        try:
            self.backend.step_end()
        except BaseException as e:
            if self._error is None:
                raise ExecError(f"device synchronize after the step failed: {e}") from e
        if self._error is not None:
            op, e = self._error
            raise ExecError(f"op {op.id} {op.label} on lane {op.lane.value} failed: "
                            f"{type(e).__name__}: {e}", op=op) from e
        return [(op, self.backend.seconds(recs[op.id].t0), self.backend.seconds(recs[op.id].t1))
                for op in to_run if recs[op.id].ran]

    def _drain(self, ends, why: str) -> bool:
        """Wait up to ABORT_GRACE_S for every lane to reach its end marker (they skip queued ops
        once aborted); True when all did, else mark the engine broken."""
        deadline = time.monotonic() + ABORT_GRACE_S
        for lane, end in ends.items():
            if not end.event.wait(max(0.0, deadline - time.monotonic())):
                cur = self._current[lane]
                what = f"op {cur.id} {cur.label}" if cur is not None else "its queue"
                self.broken = (f"{why}; lane {lane.value} was still in {what} {ABORT_GRACE_S:g}s later, "
                               "so the engine is unusable")
                return False
        return True

    def _join_lane(self, lane: Lane, end: _End) -> None:
        while not end.event.wait(POLL_S):
            # a lane failed: report it soon, whatever this lane is doing
            if self._error is not None and time.monotonic() - self._error_t > ABORT_GRACE_S:
                op, cur = self._error[0], self._current[lane]
                what = f"op {cur.id} {cur.label}" if cur is not None else "its queue"
                self.broken = (f"lane {lane.value} was still in {what} {ABORT_GRACE_S:g}s after op {op.id} "
                               f"{op.label} failed, so the engine is unusable")
                return
            if self._error is None:
                self._check_progress()

    def _check_progress(self) -> None:
        """ExecError when no op started or finished for the op timeout (StepAbandoned: for
        STOP_GRACE_S after a stop request)."""
        now, stop = time.monotonic(), self._stop_t
        idle = now - self._progress_t
        if stop is not None and now - max(stop, self._progress_t) > min(STOP_GRACE_S, self.timeout_s):
            self._give_up(StepAbandoned, f"a stop was requested and the step made no progress for "
                                         f"{min(STOP_GRACE_S, self.timeout_s):g}s")
        elif idle > self.timeout_s:
            self._give_up(ExecError, f"no op started or finished for {self.timeout_s:g}s (the op timeout; "
                                     "raise it if an op can legitimately take longer)")

    def _give_up(self, kind, why: str) -> None:
        now, stuck, lanes = time.monotonic(), None, []
        for lane in self.lanes:
            cur, since = self._current[lane], self._in_op[lane]
            if cur is None:
                continue
            if since is not None:
                stuck = stuck or cur
                lanes.append(f"lane {lane.value} in op {cur.id} {cur.label} for {now - since:.3g}s")
            else:
                lanes.append(f"lane {lane.value} waiting to start op {cur.id} {cur.label}")
        self._abort.set()
        self.broken = f"{why}: {'; '.join(lanes) or 'no lane in an op'}; the engine is unusable"
        raise kind(self.broken, op=stuck)

    def close(self) -> None:
        """Stop the lane threads. After a step was given up too: its lanes were aborted, so each
        skips what is left of its queue once its current op returns, then stops; a lane still in
        an op ABORT_GRACE_S later cannot be interrupted (a torch kernel checks for no
        cancellation) and is noted as left running, so that the program ends without the
        interpreter's teardown, which would abort it (cli/stuck_threads.py)."""
        for q in self._queues.values():
            q.put(_STOP)
        deadline = time.monotonic() + (ABORT_GRACE_S if self.broken else 5.0)
        for lane, t in zip(self.lanes, self._threads):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                cur = self._current[lane]
                where = f"in op {cur.id} {cur.label}" if cur is not None else "at its queue"
                stuck_threads.note(t, f"lane {lane.value} {where}")
