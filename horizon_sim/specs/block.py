"""The decoder block, described once per family: its projections in the order the block runs
them, every tensor it holds under transformers' names and in transformers' order, and its other
kernels (norms, RoPE, attention, activation, residual adds) with their widths and what autograd
keeps of them. Each family composes its block from block_parts.py in its own module
(specs/families/<name>.py); this module asks the spec's family. ModelSpec's parameter counts,
the planner's GEMM shapes, elementwise bytes, saved bytes and temporaries (schedule/work.py,
which knows what each *kind* of kernel costs) and the executor's weight layout
(horizon_exec/model/layout.py) are all derived from here, so they cannot disagree; the
executor's block is held to it op by op (tests/test_families.py)."""
from functools import lru_cache

from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import KINDS, NORM_KINDS, NORMS, PARTS, ROUTERS, Kernel, Projection, tensor_elements
from horizon_sim.specs.families import family

__all__ = ["KINDS", "NORM_KINDS", "NORMS", "PARTS", "ROUTERS", "Kernel", "Projection", "kernels", "norm_tensors", "parameter_count",
           "parameters", "projections"]


def _one_shape(m) -> None:
    """A model whose blocks differ (dense ones first) is asked per block: m.block_spec(layer)."""
    if not m.uniform:
        raise HorizonError(f"model {m.name!r} has {m.first_dense_layers} dense blocks before its MoE ones: its "
                           "blocks are described one shape at a time (ModelSpec.block_spec)")


@lru_cache(maxsize=256)  # the planner asks for a model's counts per unit of every step it builds
def projections(m) -> tuple[Projection, ...]:
    """The block's projections (a ModelSpec's), in the order its forward runs them."""
    _one_shape(m)
    return tuple(family(m.family).projections(m))


def norm_tensors(m) -> tuple[str, ...]:
    """The tensors of one norm: RMSNorm a weight, LayerNorm a weight and a bias."""
    return family(m.family).norm_tensors


@lru_cache(maxsize=256)
def parameters(m) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every tensor of the block, in transformers' order."""
    _one_shape(m)
    return tuple(family(m.family).tensors(m))


@lru_cache(maxsize=256)
def parameter_count(m) -> int:
    """Elements of every tensor of the block."""
    return tensor_elements(parameters(m))


@lru_cache(maxsize=256)
def kernels(m) -> tuple[Kernel, ...]:
    """The block's non-GEMM kernels in forward order (the executor's family forward runs them)."""
    _one_shape(m)
    return tuple(family(m.family).kernels(m))


def buffers(m) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of the block's non-parameter tensors (ModelFamily.buffers: fp32, never trained)."""
    _one_shape(m)
    return tuple(family(m.family).buffers(m))
