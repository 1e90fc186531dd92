"""Reading the project's YAML files with libyaml's C loader when PyYAML has it.

The pure-Python loader cost ~0.1 s of every job process (the variant registry, the network).
Both loaders raise yaml.MarkedYAMLError subclasses with `problem` and `problem_mark`, so the
callers' messages keep their line numbers.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from .errors import ConfigError

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(stream):
    """yaml.safe_load, through the C loader where available."""
    return yaml.load(stream, Loader=_SAFE_LOADER)


def read_yaml_file(path: Path):
    """A YAML file's contents; a missing or unparsable file is one ConfigError line naming it (and the line)."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        return load_yaml(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
