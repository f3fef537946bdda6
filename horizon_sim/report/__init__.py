"""Views of a simulated (or measured) step: a Chrome/Perfetto trace (trace.py), a Gantt
overlap plot with device memory below it (gantt.py), a standalone memory plot (memory_plot.py).
Plots use matplotlib's object API (no pyplot, no global backend), imported only here.
The reports/ builder is build.py (the driver, `python -m horizon_sim.report.build`) with one
module per README section (headline, fit_table, optimizer_modes, checkpoints, feasibility,
readme) and its helpers (config, out, fmt)."""
