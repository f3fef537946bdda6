"""Reading a unit's optimizer state wherever the Schedule put it (RAM or the disk tier), for tests
that compare runs whose state lives in different places."""
import torch

from horizon_sim.schedule import Holds, Space


def moments(tr, u) -> torch.Tensor:
    """Unit u's Adam moments (m and v, flat fp32), read from the disk tier's file when it holds them."""
    b = tr.sched.find(Holds.MOMENTS, u)
    if b.space == Space.DISK:
        t = torch.empty(b.shape, dtype=torch.float32)
        tr.disk.read(b.name, t)
        return t.view(-1)
    return tr.store.of(Holds.MOMENTS, u).clone().view(-1)
