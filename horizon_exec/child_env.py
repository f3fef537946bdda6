"""The environment a child Python process of Horizon gets: this checkout importable first, and
nothing that would make the child build or load code from where the user stands (shared by the
measurement children, measure/child.py, and the data-parallel launcher, dist/launch.py)."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout (or site-packages folder) that holds horizon_exec."""


def child_env(extra: dict | None = None) -> dict:
    """This environment, plus `extra`, with the checkout importable (PYTHONPATH first). An empty
    or relative XDG_CACHE_HOME is dropped, as the XDG spec says: torch would otherwise build
    DeepSpeed's JIT ops into, and load them from, torch_extensions/ under the child's folder."""
    env = dict(os.environ, **(extra or {}))
    if not os.path.isabs(env.get("XDG_CACHE_HOME", "/")):
        del env["XDG_CACHE_HOME"]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env
