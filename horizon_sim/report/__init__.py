"""Views of a simulated (or measured) step: a Chrome/Perfetto trace (trace.py), a Gantt
overlap plot with device memory below it (gantt.py), a standalone memory plot (memory_plot.py).
Plots use matplotlib's object API (no pyplot, no global backend), imported only here."""
