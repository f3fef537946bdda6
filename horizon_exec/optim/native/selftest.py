"""Self-test of a freshly built native object (adamw.c, xent.c), run in a child process
before the build is cached.

Why a child: a `-march=native` build can meet a CPU (or a hypervisor) that reports an
instruction set it does not run, and then the first call dies with SIGILL, taking the
trainer with it. Run here, such a death only rejects that build, and the next flag set is tried.

The check is one AdamW step of every kernel variant (fp32 or bf16 gradient, fp32 or bf16
moments, with and without the working copy, clipped) on 37 elements (the vectorized body and
the scalar tail; the working copy starts one element before a cache-line boundary), against
the same formula in double precision; then the split master (split/join round trips,
specials included, and one step) and the bf16 master (one step); then the loss kernel
(xent.c) on rows of 37 and 48 logits, fp32 and bf16, one label ignored, against the loss and
softmax gradient in double precision. The tolerance (1e-5 relative, plus bf16 rounding where
bf16 is stored) catches a wrong build, not ulp-level differences. No torch: the child starts in about 50 ms.

    python -m horizon_exec.optim.native.selftest PATH.so    # exit 0, or 1 with the first mismatch
"""
import ctypes
import math
import struct
import sys

from horizon_exec.optim.native import AdamwHyper, bind_all

N = 37
LR, B1, B2, EPS, WD, STEP, COEF = 1e-2, 0.9, 0.95, 1e-8, 0.1, 3, 0.5
BC1, BC2 = 1 - B1 ** STEP, 1 - B2 ** STEP  # the bias corrections


def _bf16_bits(x: float) -> int:
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def _from_bf16(h: int) -> float:
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _inputs():
    """Deterministic values of mixed sign and size (no RNG: the same on every machine)."""
    p = [_f32(math.sin(1.7 * i + 0.3) * (1 + i % 5)) for i in range(N)]
    g = [_from_bf16(_bf16_bits(math.cos(0.9 * i) * 1e-2)) for i in range(N)]  # exact in bf16
    m = [_from_bf16(_bf16_bits(math.sin(0.5 * i) * 1e-3)) for i in range(N)]
    v = [_from_bf16(_bf16_bits((1.1 + math.cos(i)) * 1e-5)) for i in range(N)]
    return p, g, m, v


def _reference(p, g, m, v):
    out = []
    for pi, gi, mi, vi in zip(p, g, m, v):
        gi *= COEF
        mi = B1 * mi + (1 - B1) * gi
        vi = B2 * vi + (1 - B2) * gi * gi
        pi = pi * (1 - LR * WD) - LR / BC1 * mi / (math.sqrt(vi) / math.sqrt(BC2) + EPS)
        out.append((pi, mi, vi))
    return out


def _hyper() -> AdamwHyper:
    return AdamwHyper(decay=1 - LR * WD, lerp_w=1 - B1, beta2=B2, one_m_beta2=1 - B2, bc2_sqrt=math.sqrt(BC2),
                      eps=EPS, neg_step_size=-LR / BC1, grad_coef=COEF)


def _off_line(array_type):
    """N uint16s starting one element before a 64-byte line boundary (inside a new array of
    array_type, kept alive by the view): the kernel's streaming stores need a line-aligned
    address, so this runs its scalar lead-in and then its vector body."""
    whole = array_type()
    addr = ctypes.addressof(whole)
    view = (ctypes.c_uint16 * N).from_address(addr + (62 - addr % 64) % 64)
    view._keep = whole
    return view


def check(path: str) -> str:
    """'' if every variant of the kernel at `path` computes AdamW, else what went wrong."""
    fns = bind_all(ctypes.CDLL(path))
    fn = fns["adamw"]
    p, g, m, v = _inputs()
    want = _reference(p, g, m, v)
    h = _hyper()
    for g_bf16 in (0, 1):
        for s_bf16 in (0, 1):
            for with_wc in (0, 1):
                def buf(vals, bf16):
                    if bf16:
                        return (ctypes.c_uint16 * N)(*[_bf16_bits(x) for x in vals])
                    return (ctypes.c_float * N)(*vals)
                bp, bg, bm, bv = buf(p, 0), buf(g, g_bf16), buf(m, s_bf16), buf(v, s_bf16)
                wc = _off_line(ctypes.c_uint16 * (N + 32)) if with_wc else None
                rc = fn(bp, bg, g_bf16, bm, bv, s_bf16, wc, N, ctypes.byref(h), 1)
                what = f"grad {'bf16' if g_bf16 else 'fp32'}, moments {'bf16' if s_bf16 else 'fp32'}"
                if rc != 0:
                    return f"{what}: returned {rc}"
                tol_s = 2.0 ** -8 if s_bf16 else 1e-5
                for i, (pi, mi, vi) in enumerate(want):
                    got = (bp[i], _from_bf16(bm[i]) if s_bf16 else bm[i], _from_bf16(bv[i]) if s_bf16 else bv[i])
                    for name, a, b, tol in (("param", got[0], pi, 1e-5), ("exp_avg", got[1], mi, tol_s),
                                            ("exp_avg_sq", got[2], vi, tol_s)):
                        if not abs(a - b) <= tol * abs(b) + 1e-30:
                            return f"{what}: {name}[{i}] = {a!r}, expected {b!r}"
                    if wc is not None and wc[i] != _bf16_bits(got[0]):
                        return f"{what}: working copy[{i}] = {wc[i]:#06x}, expected {_bf16_bits(got[0]):#06x}"
    return (_check_split(fns, p, g, m, v, want, h) or _check_bf16_master(fns, p, g, m, v, want, h)
            or _check_xent(fns["xent"]))


def _check_split(fns, p, g, m, v, want, h) -> str:
    """The split master: split/join round trips (specials included) and one AdamW step of it
    equals the fp32 master's reference."""
    specials = [0.0, -0.0, 1.0, -1.5, 3.4e38, -3.4e38, 1e-40, -1e-45, float("inf"), float("-inf")]
    vals = (ctypes.c_float * (N + len(specials)))(*(p + specials))
    hi, lo = (ctypes.c_uint16 * len(vals))(), (ctypes.c_int16 * len(vals))()
    back = (ctypes.c_float * len(vals))()
    if fns["split"](vals, hi, lo, len(vals), 1) or fns["join"](hi, lo, back, len(vals), 1):
        return "split/join: rejected their arguments"
    for i in range(len(vals)):
        if struct.pack("<f", back[i]) != struct.pack("<f", vals[i]):
            return f"split/join: {vals[i]!r} came back as {back[i]!r}"
    g32 = (ctypes.c_float * N)(*g)
    m32, v32 = (ctypes.c_float * N)(*m), (ctypes.c_float * N)(*v)
    if fns["adamw_split"](hi, lo, g32, 0, m32, v32, 0, N, ctypes.byref(h), 1):
        return "split master: rejected its arguments"
    fns["join"](hi, lo, back, N, 1)
    for i, (pi, _, _) in enumerate(want):
        if not abs(back[i] - pi) <= 1e-5 * abs(pi) + 1e-30:
            return f"split master: param[{i}] = {back[i]!r}, expected {pi!r}"
    return ""


def _check_bf16_master(fns, p, g, m, v, want, h) -> str:
    """A bf16 master: one AdamW step, rounded to bf16 (the step starts from p rounded)."""
    start = [_from_bf16(_bf16_bits(x)) for x in p]
    ref = _reference(start, g, m, v)
    pb = (ctypes.c_uint16 * N)(*[_bf16_bits(x) for x in start])
    g32, m32, v32 = (ctypes.c_float * N)(*g), (ctypes.c_float * N)(*m), (ctypes.c_float * N)(*v)
    if fns["adamw_bf16"](pb, g32, 0, m32, v32, 0, N, ctypes.byref(h), 1):
        return "bf16 master: rejected its arguments"
    for i, (pi, _, _) in enumerate(ref):
        if not abs(_from_bf16(pb[i]) - pi) <= 2.0 ** -8 * abs(pi) + 1e-30:
            return f"bf16 master: param[{i}] = {_from_bf16(pb[i])!r}, expected {pi!r}"
    return ""


def _check_xent(fn) -> str:
    """Two rows of each width (37: a vector body and a tail; 48: whole vectors), the second
    row's label ignored (-100): the row losses and, written in place, the gradient
    (softmax - onehot) * scale, against double precision (bf16: within its rounding)."""
    scale = 0.25
    for vocab in (37, 48):
        rows = [[_f32(3 * math.sin(0.37 * j + r) - r) for j in range(vocab)] for r in range(2)]
        labels = (ctypes.c_int64 * 2)(vocab - 2, -100)
        for bf16 in (0, 1):
            vals = [[_from_bf16(_bf16_bits(x)) if bf16 else x for x in row] for row in rows]
            flat = [x for row in vals for x in row]
            buf = (ctypes.c_uint16 * len(flat))(*map(_bf16_bits, flat)) if bf16 else (ctypes.c_float * len(flat))(*flat)
            loss = (ctypes.c_float * 2)()
            what = f"loss kernel, {vocab} logits, {'bf16' if bf16 else 'fp32'}"
            if fn(buf, bf16, labels, 2, vocab, vocab, ctypes.c_float(scale), 1, loss, 1):
                return f"{what}: rejected its arguments"
            for r, row in enumerate(vals):
                lse = max(row) + math.log(sum(math.exp(x - max(row)) for x in row))
                want_loss = lse - row[labels[r]] if labels[r] >= 0 else 0.0
                if not abs(loss[r] - want_loss) <= 1e-5 * abs(lse) + 1e-30:
                    return f"{what}: row {r} loss {loss[r]!r}, expected {want_loss!r}"
                for j, x in enumerate(row):
                    want = (math.exp(x - lse) - (j == labels[r])) * (scale if labels[r] >= 0 else 0.0)
                    got = _from_bf16(buf[r * vocab + j]) if bf16 else buf[r * vocab + j]
                    if not abs(got - want) <= (2.0 ** -8 if bf16 else 1e-5) * abs(want) + 1e-7:
                        return f"{what}: row {r} gradient[{j}] = {got!r}, expected {want!r}"
    return ""


def main():
    why = check(sys.argv[1])
    if why:
        print(why)
        sys.exit(1)


if __name__ == "__main__":
    main()
