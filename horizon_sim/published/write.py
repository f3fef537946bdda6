"""The suite's files: published.csv (every row, with its citation), published.md (the table as
`horizon validate --published` prints it, and the rows not compared with their reasons) and
published.png (plot.py)."""
from pathlib import Path

from horizon_sim.published.suite import SuiteResult
from horizon_sim.safe_files import write_atomic


def write_published(res: SuiteResult, out_dir: Path, plots: bool = True) -> list[Path]:
    out_dir = Path(out_dir)
    csv = out_dir / "published.csv"
    write_atomic(csv, res.table.to_csv(index=False, float_format="%.6g").encode(), "published.csv")
    md = out_dir / "published.md"
    cites = "\n".join(f"- `{r.id}`: {r.source}; {r.cite}" for r in res.table.itertuples())
    write_atomic(md, ("```\n" + res.text() + "\n```\n\nSources:\n\n" + cites + "\n").encode(), "published.md")
    files = [csv, md]
    if plots:
        from horizon_sim.published.plot import plot_published
        files.append(plot_published(res, out_dir / "published.png"))
    return files
