"""Published measurements and the planner set beside them (`horizon validate --published`).

measurements.toml holds one row per published figure: its source, the setup as the source ran
it (as `horizon plan` flags, plus a model shape where no preset matches) and the measured value.
rows.py reads and checks it; quantity.py says how each quantity is read from a plan; suite.py
plans every row and tabulates predicted, published and error; plot.py draws them."""
from horizon_sim.published.rows import PublishedRow, load_rows
from horizon_sim.published.suite import SuiteResult, run_suite

__all__ = ["PublishedRow", "SuiteResult", "load_rows", "run_suite"]
