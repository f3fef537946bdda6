"""Text formatting shared by the report sections: markdown tables, numbers (GiB, tokens/s,
percentages, seconds), sizes as sold ('1.5 TiB'), RAM labels, and policies as flags or as one
descriptive line."""
from horizon_sim.plan.advice import policy_flags
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB, TiB, fmt_bytes, parse_size


def md_table(rows: list[dict], cols: list[tuple]) -> str:
    """A GitHub markdown table. cols: (header, key, formatter, align 'l' or 'r')."""
    head = "| " + " | ".join(h for h, *_ in cols) + " |"
    rule = "|" + "|".join(("---:" if a == "r" else ":---") for *_, a in cols) + "|"
    body = ["| " + " | ".join(f(r[k]) for _, k, f, _ in cols) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def gib(n) -> str:
    return f"{n / GiB:,.1f}"


def tps(v) -> str:
    return "-" if v is None or v != v else f"{v:,.0f}"


def pct(v) -> str:
    return "-" if v is None or v != v else f"{v:.1%}"


def secs(v) -> str:
    """Seconds to 3 significant digits: '47.1 s', '0.822 s'."""
    return f"{v:.3g} s"


def size(n: int) -> str:
    """Whole sizes as sold: '256 GiB', '1.5 TiB'; otherwise fmt_bytes."""
    for unit, b in (("TiB", TiB), ("GiB", GiB)):
        if n >= b and (n * 4) % b == 0:
            return f"{n / b:g} {unit}"
    return fmt_bytes(n)


def ram_label(ram: str) -> str:
    """'1.5TB' -> '1.5 TB (1.36 TiB)'; '512GiB' -> '512 GiB'."""
    n = parse_size(ram)
    if ram.lower().endswith("ib"):
        return size(n)
    num = ram.rstrip("BbKkMmGgTt")
    return f"{num} {ram[len(num):]} ({fmt_bytes(n)})"


def flags_or_default(p: Policy, base: Policy) -> str:
    f = policy_flags(p, base)
    return f"`{f}`" if f else "(as default)"


def policy_text(p: Policy) -> str:
    return (f"batch {p.batch} x seq {p.seq} ({p.micro_batches} micro-batch{'es' if p.micro_batches > 1 else ''}), "
            f"K={p.act_ckpt_every}, {p.slots} slots, checkpoints on {p.act_ckpt_on}, optimizer {p.optimizer}, "
            f"clip {p.grad_clip:g}, {'split ' if p.split_master else p.master_dtype + ' '}master, moments {p.states_dtype}, "
            f"working copy {'on' if p.working_copy else 'off'}")
