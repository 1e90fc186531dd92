"""The one place that knows where the checkout's files are.

convsweep runs from its checkout: kernels, the registry, networks, data, schemas, queries and
migrations are files beside the package, which a person edits and Snakemake watches. An
install that copied the package alone (a non-editable `pip install .`) has none of them, and
is refused with one line before anything else happens.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from .errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
KERNELS_DIR = ROOT / "kernels"
REGISTRY_PATH = KERNELS_DIR / "variants.yaml"
NETWORKS_DIR = ROOT / "networks"
DATA_DIR = ROOT / "data"
SCHEMAS_DIR = ROOT / "workflow" / "schemas"
DB_DIR = ROOT / "db"
QUERIES_DIR = DB_DIR / "queries"
MIGRATIONS_DIR = DB_DIR / "migrations"
DEFAULT_DB_URL = "sqlite:///db/results.sqlite"  # relative to where convsweep runs; $CONVSWEEP_DB overrides
RESULTS_DIR = Path("results")  # relative to where convsweep runs: figures, reports, each experiment's files
NAME_MAX_CHARS = 100  # a file-name component made of a stored name; the file system allows 255 bytes

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_UNSAFE_CHARACTERS = re.compile(r"[^A-Za-z0-9._+-]+")
_HASH_CHARS = 12
# What safe_name appends: a name ending so is hashed too, so that no name taken as it is reads as another's.
_HASHED = re.compile(rf"(?:.*-)?[0-9a-f]{{{_HASH_CHARS}}}")


def cache_dir() -> Path:
    """Compiled kernels, upscaled images and reference logits: derived data, safe to delete."""
    return Path(os.environ.get("CONVSWEEP_CACHE") or Path.home() / ".cache" / "convsweep")


def safe_name(name: str) -> str:
    """A name that comes from stored data (an experiment, a variant) as one component of a file name: the
    name itself where it is plain (letters, digits, '.', '_', '+', '-', not starting with '.', at most
    NAME_MAX_CHARS), else its plain characters, cut, and a hash of the whole name, so two names stay two
    files. Never empty, absolute, '.' or '..', and never holding a '/'."""
    if len(name) <= NAME_MAX_CHARS and _SAFE_NAME.fullmatch(name) and not _HASHED.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    kept = _UNSAFE_CHARACTERS.sub("_", name).lstrip("._+-")[:NAME_MAX_CHARS - _HASH_CHARS - 1].rstrip("._+-")
    return f"{kept}-{digest}" if kept else digest


def results_directory(*names: str) -> Path:
    """RESULTS_DIR/<name>/...: each name (an experiment, 'figures') made safe, so a stored name never leads
    out of it."""
    return RESULTS_DIR.joinpath(*(safe_name(name) for name in names))


def resolve_network_path(value: str | os.PathLike, relative_to: str | os.PathLike | None = None) -> Path:
    """Where a network file named in a sweep, bench file, job spec or command line is: an absolute
    path as given; otherwise beside the file (or in the directory) that names it, then in the
    checkout. A path found nowhere is returned as the first candidate, for the caller's one-line error."""
    path = Path(value)
    if path.is_absolute():
        return path
    candidates = [Path(relative_to) / path] if relative_to is not None else []
    candidates.append(ROOT / path)
    return next((c for c in candidates if c.is_file()), candidates[0])


def require_checkout() -> None:
    """Refuse to run from a package that was copied away from its checkout."""
    if not REGISTRY_PATH.is_file():
        raise ConfigError(f"{Path(__file__).parents[1]} is not in a convsweep checkout (no {REGISTRY_PATH}): "
                          "install it from the repository with `pip install -e .`")


def check_same_checkout(planned_from: str | Path) -> None:
    """Refuse when this convsweep is not the one of the checkout a sweep was planned from."""
    planned = Path(planned_from).resolve()
    if planned != ROOT:
        raise ConfigError(f"the sweep was planned from the checkout {planned}, but this convsweep is "
                          f"{ROOT / 'convsweep'}: run the Snakefile of the checkout convsweep is installed from, "
                          f"or `pip install -e {planned}`")


def relative_to_root(path: Path) -> str:
    """A checkout path as the records store it (relative, so two clones agree); others absolute."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)
