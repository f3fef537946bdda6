"""StepBuilder: what every schedule family's builder shares. A family (Horizon's streaming step,
the ZeRO-3 offload peer, ...) says which ops a step runs and in what order; the base holds the
op list and the dependency tracker that derives each op's waits from its buffer accesses, the
buffer declarations (the unit sizes, the host store), the global gradient norm, and the meta a
Schedule carries. A new family subclasses it, emits its ops and calls `schedule()`;
plan/families.py registers it by name."""
from horizon_sim.schedule.declare import Declarations
from horizon_sim.schedule.deps import Deps
from horizon_sim.schedule.limits import check_sizes
from horizon_sim.schedule.op import EMBED, Family, Op, OpKind, ScheduleMeta
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


class StepBuilder:
    family = Family.HORIZON
    """What the Schedule's meta says built it."""

    def __init__(self, model: ModelSpec, policy: Policy, layout: Layout = ONE):
        check_sizes(model, policy)  # before any work that grows with the sizes
        self.model, self.policy, self.layout = model, policy, layout
        self.head = model.n_layers
        self.units = [EMBED, *range(model.n_layers), self.head]
        self.bufs = Declarations(model, policy, layout)
        self.ops: list[Op] = []
        self.deps = Deps()

    def extra_waits(self, op_id: int) -> tuple[int, ...]:
        """Waits a family adds to every op (none here; a synchronous peer waits for the op before)."""
        return ()

    def emit(self, kind, unit, micro=0, *, reads=(), writes=(), frees=(), after=(), **work_) -> int:
        """Append an op; its waits are the data hazards on what it reads, writes and frees, plus
        `after` (waits that are not data hazards: backpressure, a bound on what is in flight)."""
        op_id = len(self.ops)
        deps = self.deps.add(op_id, kind, reads, writes, frees, extra=(*after, *self.extra_waits(op_id)))
        self.ops.append(Op(id=op_id, kind=kind, unit=unit, micro=micro, deps=deps, reads=tuple(reads),
                           writes=tuple(writes), frees=tuple(frees), **work_))
        return op_id

    def grad_norm(self) -> None:
        """The global gradient norm (clipping, logging) from every unit's squared norm; with
        several ranks each holds its share's, and the global one sums all ranks'."""
        b = self.bufs
        self.emit(OpKind.GRAD_NORM, -1, reads=[b.grad_sq(u) for u in self.units], writes=[b.grad_norm_scalar()],
                  host_bytes=8 * len(self.units))
        if self.layout.ranks > 1:
            self.emit(OpKind.NORM_ALL_REDUCE, -1, reads=[b.grad_norm_scalar()], writes=[b.grad_norm_scalar()], peers=self.layout.ranks,
                      net_bytes=8)

    def schedule(self, *, slot_bytes: int, model_flops: float, purpose: str = "train") -> Schedule:
        """The ops emitted so far as a Schedule, with the meta that says what built it."""
        model, p = self.model, self.policy
        meta = ScheduleMeta(model=model, policy=p, n_layers=model.n_layers, slot_bytes=slot_bytes, tokens=p.tokens,
                            model_flops=model_flops, layout=self.layout, purpose=purpose, family=self.family)
        return Schedule(ops=tuple(self.ops), buffers=dict(self.bufs.buffers), meta=meta)
