"""Hugging Face model ids ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B@main") resolved to a
snapshot folder of the local hub cache, the way transformers finds them offline. Never
downloads: a model that is not in the cache is a one-line error saying so.

Cache location, as huggingface_hub reads it: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else
$HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub ($VARS and ~
expanded). An empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says (huggingface_hub
would look under the current folder). Only data is read from it (config, tokenizer files,
safetensors, never code), and never written. A model lives in models--{org}--{name}/, with
refs/{branch} holding a commit hash and snapshots/{commit}/ the files.
"""
import os
import re
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import refuse_non_regular

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")


def hub_cache_dir() -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return _expanded(os.environ[var])
    home = os.environ.get("HF_HOME")
    if home:
        return _expanded(home) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "huggingface" / "hub"


def _expanded(value: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(value)))


def looks_like_model_id(s: str) -> bool:
    """'org/name' or 'org/name@revision' that is not a path on disk."""
    return bool(_ID.match(s)) and not os.path.exists(s)


def resolve_model_dir(name: str, need: str = "config.json") -> Path:
    """The snapshot folder of model id `name` in the local hub cache (it must hold `need`)."""
    repo, _, rev = name.partition("@")
    rev = rev or "main"
    if ".." in rev.split("/"):  # a revision names a ref or a commit, never a path out of the cache
        raise HorizonError(f"{name!r}: revision {rev!r} is not a branch, tag or commit name")
    cache = hub_cache_dir()
    root = cache / ("models--" + repo.replace("/", "--"))
    if not root.is_dir():
        raise HorizonError(f"{name!r} is neither a local folder nor a model in the local Hugging Face cache "
                           f"({cache}); Horizon never downloads: fetch it first (e.g. `hf download {repo}`) "
                           "or give a folder")
    ref = root / "refs" / rev
    commit = _read_ref(ref) if ref.exists() else rev
    snap = root / "snapshots" / commit
    if not snap.is_dir():
        have = sorted(p.name for p in (root / "refs").glob("*")) if (root / "refs").is_dir() else []
        raise HorizonError(f"{name!r}: revision {rev!r} is not in the local cache ({root}); cached refs: "
                           f"{', '.join(have) or 'none'}")
    if not (snap / need).is_file():
        raise HorizonError(f"{name!r}: the cached snapshot {snap} has no {need} (a partial download?)")
    return snap


_COMMIT = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def _read_ref(ref: Path) -> str:
    """The commit a refs/<branch> file names. A damaged cache (binary bytes, a FIFO, a folder,
    a path instead of a hash) is one line naming the file, never a UnicodeDecodeError, a hang
    or a snapshot outside the cache."""
    refuse_non_regular(ref, "the cache's ref file")
    try:
        with open(ref, "rb") as f:
            raw = f.read(256)
        commit = raw.decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise HorizonError(f"{ref}: damaged Hugging Face cache ref ({type(e).__name__}); "
                           "want a commit hash: fetch the model again") from None
    if not _COMMIT.match(commit) or commit in (".", ".."):
        raise HorizonError(f"{ref}: damaged Hugging Face cache ref ({raw[:40]!r}); want a commit hash: "
                           "fetch the model again")
    return commit
