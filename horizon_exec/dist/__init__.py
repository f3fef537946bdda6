"""Data parallel execution on torch.distributed: the ranks' context and process groups
(context.py), the node's shared host store (shared.py), the collective ops (collectives.py) and
the launcher behind `horizon train --nproc-per-node` (launch.py)."""
