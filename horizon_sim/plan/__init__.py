"""Planning API: one call from names to a verdict."""
from horizon_sim.plan.plan import plan

__all__ = ["plan"]
