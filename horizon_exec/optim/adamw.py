"""CPU AdamW on one unit's flat buffers.

The update is torch.optim.AdamW's (decoupled weight decay, bias correction) with the step
counter incremented before the kernel, as torch's own fused path does. Global-norm clipping
matches torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6)), applied
inside the kernel, so clipping costs no extra pass over the gradient. The native kernel
multiplies the gradient by it, as clip_grad_norm_ does; torch's kernel takes grad_scale =
1/coef and divides (within an ulp of the same gradient).

Which kernel (`kernel="auto"`):
- the native one-pass kernel (native/adamw.c) whenever the master is fp32 or bf16 and it builds here:
  it widens a bf16 gradient, clips, updates fp32 or bf16 moments and refreshes the bf16
  working copy in one pass over memory, 28 bytes per parameter with fp32 moments, what
  torch's fused kernel moves for the bare update on an fp32 gradient. (Torch's kernel also
  writes the clipped gradient back when given grad_scale: 4 more bytes per parameter.)
- otherwise torch._fused_adamw_: one call when the gradient is already fp32 and there is no
  working copy; else in cache-sized chunks (a bf16 gradient chunk widened into fp32 scratch,
  the kernel, the working copy refreshed while the chunk is in cache). Measured on one core,
  that path runs at ~0.65x torch's bare kernel on an fp32 gradient (the casts), the native
  one at ~0.92-1.10x (median 0.99) while doing the casts too (benchmarks/exec_vs_autograd.py;
  memory-bound there: streaming stores for the working copy and a store on huge pages keep
  its bytes at torch's 28 per parameter).
  bf16 moments with an fp32 master, and fp32 moments with a bf16 master, need the native kernel.
- a bf16 master (no fp32 master): read as fp32, updated in fp32, stored rounded to nearest even;
  an update smaller than half a bf16 ulp of the weight is lost (the seed code's policy).
- a split master (optim/split.py: the bf16 working copy + the low 16 bits of the fp32 master):
  `step_split`, native kernel only; the master it holds is updated bit for bit as step()
  updates an fp32 master.
`kernel="native"` or `"torch"` forces one (tests, benchmarks).
"""
import ctypes
import math
from dataclasses import dataclass

import torch

from horizon_exec.optim import native
from horizon_exec.dtypes import TORCH_DTYPE
from horizon_exec.errors import ConfigError, ExecError
from horizon_sim.errors import HorizonError

KERNELS = ("auto", "native", "torch")
MAX_LR = 1.0
"""Largest learning rate accepted. Adam's update per element is about lr (m / sqrt(v) is
about +-1), so at lr > 1 one step moves each weight by more than a trained LLM's weights
measure (init std 0.02, trained values rarely above 1): the run is destroyed at once, and
lr 1e30 turned every weight non-finite. Typical values are 1e-5 .. 1e-2."""
MIN_EPS = 1.1754944e-38
"""Smallest eps accepted: the kernels compute in float32, where a smaller eps is denormal or
0 (1e-46 rounds to 0), and m / (sqrt(v) + 0) is 0/0 = NaN for every weight whose gradient
has been 0 (e.g. embedding rows of tokens not seen yet)."""
MAX_EPS = 1e-2
"""Largest eps accepted: eps is added to sqrt(v), which is of the order of the gradients
(1e-3 .. 1e-6 for LLMs); at eps >> |g| the update lr * m / (sqrt(v) + eps) is about 0, a run
that trains nothing and looks healthy (--eps 1e30). Usual values are 1e-8 .. 1e-6."""


def check_hyper(*, lr: float, betas, eps: float, weight_decay: float, name=lambda f: f"AdamW {f}=") -> None:
    """HorizonError unless AdamW's hyper-parameters are usable: lr in [0, MAX_LR], each beta in
    [0, 1) (1 never forgets and its bias correction divides by 0), eps in [MIN_EPS, MAX_EPS],
    weight_decay finite >= 0 with lr * weight_decay <= 1 (the decay factor 1 - lr * wd stays in
    [0, 1]; above, weights flip sign every step). name(field) is how a message names a field."""
    def bad(field, value, want):
        raise ConfigError(field, value, want, name=name)

    if not _number(lr) or not 0 <= lr <= MAX_LR:
        bad("lr", lr, f"must lie in [0, {MAX_LR:g}] (Adam moves each weight by about lr per step; "
                      "usual values are 1e-5 .. 1e-2)")
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ConfigError("betas", betas, "must be two numbers", name=name) from None
    for field, b in (("beta1", b1), ("beta2", b2)):
        if not _number(b) or not 0 <= b < 1:
            bad(field, b, "must lie in [0, 1)")
    if not _number(eps) or not MIN_EPS <= eps < math.inf:
        bad("eps", eps, f"must be a finite number >= {MIN_EPS:.3g} (the smallest normal float32; "
                        "usual value 1e-8)")
    if eps > MAX_EPS:
        bad("eps", eps, f"must be <= {MAX_EPS:g} (it is added to sqrt(v), the gradient's scale: above, the update "
                        "lr * m / (sqrt(v) + eps) is about 0 and nothing trains; usual value 1e-8)")
    if not _number(weight_decay) or not 0 <= weight_decay < math.inf:
        bad("weight_decay", weight_decay, "must be a finite number >= 0")
    if lr * weight_decay > 1:
        bad("weight_decay", weight_decay, f"times lr {lr:g} is above 1: the decay factor 1 - lr * "
                                          "weight_decay would flip the weights' sign every step")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


@dataclass(kw_only=True, frozen=True, slots=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    kernel: str = "auto"
    """'auto' (see the module docstring), 'native' (always native/adamw.c) or 'torch'."""

    chunk_params: int = 1 << 19
    """torch path only: parameters per kernel call when a chunk must be widened or copied
    out: 2 MiB per fp32 tensor, in L2/L3 while the casts touch it (2^18..2^20 measured alike;
    2^16 pays call overhead, 2^22 spills)."""

    def __post_init__(self):
        check_hyper(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)
        if self.kernel not in KERNELS:
            raise HorizonError(f"AdamW kernel={self.kernel!r}: use one of {', '.join(KERNELS)}")

    def uses_native(self, master_dtype, states_dtype) -> bool:
        """Whether step() runs the native kernel for a master and moments of these dtypes
        (ExecError when neither kernel can: bf16 moments without the native one)."""
        torch_can = states_dtype == master_dtype  # torch's kernel: moments in the master dtype
        native_can = master_dtype in (torch.float32, torch.bfloat16)
        want_native = self.kernel == "native" or (self.kernel == "auto" and native_can)
        if want_native and not native_can:
            raise ExecError(f"the native AdamW kernel needs an fp32 or bf16 master, not {master_dtype}")
        if want_native and native.adamw() is not None:
            return True
        if not torch_can:
            what = f"Adam moments in {_short(states_dtype)} with the master in {_short(master_dtype)}"
            raise ExecError(f"{what} need the native AdamW kernel; {native.status()}" if self.kernel != "torch"
                            else f"{what}: torch's kernel needs them in the master dtype (kernel='torch')")
        if self.kernel == "native":
            raise ExecError(native.status())
        return False

    def describe(self, master_dtype, states_dtype) -> str:
        """One line for a log: the kernel step() runs for these dtypes, and why."""
        if self.uses_native(master_dtype, states_dtype):
            return native.status()
        why = "kernel='torch'" if self.kernel == "torch" else native.status()
        return f"torch's fused AdamW, casts in extra passes ({why})"

    def step(self, param, grad, exp_avg, exp_avg_sq, step, clip_coef: float = 1.0,
             lr: float | None = None, working_copy=None, scratch=None, sr_seed: int = 0):
        """param: flat fp32 (n,) host tensor (or bf16: a bf16 master, native kernel); exp_avg,
        exp_avg_sq: flat (n,) fp32 (or bf16, native kernel) moments; all updated in place.
        grad: flat (n,) fp32 or bf16. step: fp32 scalar tensor, incremented once here.
        working_copy: optional flat (n,) bf16 tensor refreshed from the updated master.
        scratch: torch path only, fp32 >= one chunk. sr_seed: a bf16 master only: 0 rounds it to
        nearest even, any other value stochastically (adamw.c), the draws a function of the seed
        and the element's index."""
        lr = self.lr if lr is None else lr
        if sr_seed and param.dtype != torch.bfloat16:
            raise ExecError(f"stochastic rounding is for a bf16 master, not {param.dtype}")
        if self.uses_native(param.dtype, exp_avg.dtype):
            _check_native(param, grad, exp_avg, exp_avg_sq, working_copy)  # before any state changes
            step += 1
            self._native(param, grad, exp_avg, exp_avg_sq, float(step), clip_coef, lr, working_copy, sr_seed)
        elif sr_seed:
            raise ExecError(f"stochastic rounding needs the native AdamW kernel; {native.status()}")
        else:
            step += 1
            self._torch(param, grad, exp_avg, exp_avg_sq, step, clip_coef, lr, working_copy, scratch)

    def step_split(self, hi, lo, grad, exp_avg, exp_avg_sq, step, clip_coef: float = 1.0, lr: float | None = None):
        """AdamW on a split master (optim/split.py): hi, flat (n,) bf16, the working copy, and
        lo, flat (n,) int16, updated in place as the fp32 master they hold would be by step();
        the other arguments as step()'s. Native kernel only."""
        lr = self.lr if lr is None else lr
        fns = native.kernels()
        if fns is None or self.kernel == "torch":
            raise ExecError(f"a split master needs the native AdamW kernel; {native.status()}")
        _check_native(hi, grad, exp_avg, exp_avg_sq, None, param_dtypes=(torch.bfloat16,))
        _check_native(lo, grad, exp_avg, exp_avg_sq, None, param_dtypes=(torch.int16,))
        step += 1
        rc = fns["adamw_split"](hi.data_ptr(), lo.data_ptr(), grad.data_ptr(), int(grad.dtype == torch.bfloat16),
                                exp_avg.data_ptr(), exp_avg_sq.data_ptr(), int(exp_avg.dtype == torch.bfloat16),
                                hi.numel(), ctypes.byref(self._hyper(float(step), clip_coef, lr)),
                                torch.get_num_threads())
        if rc != 0:
            raise ExecError(f"native AdamW rejected its arguments (code {rc})")

    def _hyper(self, step: float, clip_coef: float, lr: float, sr_seed: int = 0) -> native.AdamwHyper:
        b1, b2 = self.betas
        # Double precision here, float in the kernel: torch's fused kernel does the same.
        return native.AdamwHyper(
            decay=1.0 - lr * self.weight_decay, lerp_w=1.0 - b1, beta2=b2, one_m_beta2=1.0 - b2,
            bc2_sqrt=math.sqrt(1.0 - b2 ** step), eps=self.eps, neg_step_size=-(lr / (1.0 - b1 ** step)),
            grad_coef=min(1.0, clip_coef), sr_seed=sr_seed & (2**64 - 1))

    def _native(self, param, grad, exp_avg, exp_avg_sq, step: float, clip_coef, lr, working_copy, sr_seed=0):
        n, h = param.numel(), self._hyper(step, clip_coef, lr, sr_seed)
        g_bf16, s_bf16 = int(grad.dtype == torch.bfloat16), int(exp_avg.dtype == torch.bfloat16)
        if param.dtype == torch.bfloat16:  # a bf16 master: rounded after the update (to nearest even, or sr)
            rc = native.kernels()["adamw_bf16"](param.data_ptr(), grad.data_ptr(), g_bf16, exp_avg.data_ptr(),
                                                exp_avg_sq.data_ptr(), s_bf16, n, ctypes.byref(h),
                                                torch.get_num_threads())
        else:
            rc = native.adamw()(param.data_ptr(), grad.data_ptr(), g_bf16, exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
                                s_bf16, working_copy.data_ptr() if working_copy is not None else None, n,
                                ctypes.byref(h), torch.get_num_threads())
        if rc != 0:
            raise ExecError(f"native AdamW rejected its arguments (code {rc})")

    def _torch(self, param, grad, exp_avg, exp_avg_sq, step, clip_coef, lr, working_copy, scratch):
        scale = None if clip_coef >= 1.0 else torch.tensor(1.0 / clip_coef, dtype=torch.float32)
        kw = dict(lr=lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=self.weight_decay,
                  eps=self.eps, amsgrad=False, maximize=False, grad_scale=scale)
        widen = grad.dtype != param.dtype
        if widen and (scratch is None or scratch.numel() < min(self.chunk_params, grad.numel())):
            scratch = torch.empty(min(self.chunk_params, grad.numel()), dtype=param.dtype)
        n = param.numel()
        chunk = self.chunk_params if widen or working_copy is not None else n  # else: one call
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            g = scratch[:e - s].copy_(grad[s:e]) if widen else grad[s:e]
            torch._fused_adamw_([param[s:e]], [g], [exp_avg[s:e]], [exp_avg_sq[s:e]], [], [step], **kw)
            if working_copy is not None:
                working_copy[s:e].copy_(param[s:e])


def _check_native(param, grad, exp_avg, exp_avg_sq, working_copy, param_dtypes=(torch.float32, torch.bfloat16)) -> None:
    """The native kernel reads raw pointers: every buffer must be what it assumes."""
    n = param.numel()
    if working_copy is not None and param.dtype != torch.float32:
        raise ExecError(f"native AdamW: a working copy is refreshed from an fp32 master, not {param.dtype}")
    for name, t, ok in (("param", param, param_dtypes),
                        ("grad", grad, (torch.float32, torch.bfloat16)),
                        ("exp_avg", exp_avg, (torch.float32, torch.bfloat16)),
                        ("exp_avg_sq", exp_avg_sq, (exp_avg.dtype,)),
                        ("working_copy", working_copy, (torch.bfloat16,))):
        if t is not None and (t.dtype not in ok or t.numel() != n or not t.is_contiguous()
                              or t.device.type != "cpu"):
            raise ExecError(f"native AdamW: {name} is {tuple(t.shape)} {t.dtype} on {t.device}; "
                            f"needs {n} contiguous CPU elements of {' or '.join(map(str, ok))}")


def _short(dtype) -> str:
    return {v: k for k, v in TORCH_DTYPE.items()}.get(dtype, str(dtype))


def clip_coef(grad_clip: float, total_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor (1.0 when clipping is off)."""
    if grad_clip <= 0:
        return 1.0
    return min(1.0, grad_clip / (total_norm + 1e-6))
