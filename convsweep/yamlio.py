"""Reading the project's YAML files with libyaml's C loader when PyYAML has it.

The pure-Python loader cost ~0.1 s of every job process (the variant registry, the network).
Both loaders raise yaml.MarkedYAMLError subclasses with `problem` and `problem_mark`, so the
callers' messages keep their line numbers.
"""
from __future__ import annotations

import yaml

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(stream):
    """yaml.safe_load, through the C loader where available."""
    return yaml.load(stream, Loader=_SAFE_LOADER)
