"""JSON Schema validation of the project's files, with one error style: `file: key.path: what was expected`.

experiments.yaml, bench files, the variant registry and result JSONs are each described by a
schema in workflow/schemas/ (defaults live there too, as Snakemake's `validate` expects). Checks
a schema cannot express (a variant name the registry must know, a layer the network must have)
stay in code and raise the same one-line ConfigError.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .fileio import write_json_atomic
from .paths import SCHEMAS_DIR, cache_dir
from .yamlio import read_yaml_file

if TYPE_CHECKING:
    import jsonschema


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """workflow/schemas/<name>.schema.yaml, read once per process."""
    return read_yaml_file(SCHEMAS_DIR / f"{name}.schema.yaml")


@functools.cache
def _validator_class(fill_defaults: bool):
    """Draft 2020-12; with `fill_defaults`, a validator that also writes schema defaults into the
    instance, as Snakemake's validate does. jsonschema is imported here, on first use: a job
    process whose files were checked before never pays for it (see variants.load_registry)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    if not fill_defaults:
        return base

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = json.loads(json.dumps(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def key_path(path) -> str:
    """`experiments.lenet.batches[0]` from a JSON path; `(top level)` for the document itself."""
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in path]
    return ".".join(parts).replace(".[", "[") or "(top level)"


MAX_VALUE_CHARS = 80  # of a value quoted in an error line: a whole result section would drown the line


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown key")
    if error.validator == "type":
        return f"expected {error.validator_value}, got {_shown(error.instance)}"
    if error.validator == "enum":
        return f"expected one of {error.validator_value}, got {_shown(error.instance)}"
    if error.validator == "const":
        return f"expected {json.dumps(error.validator_value)}, got {_shown(error.instance)}"
    if error.validator in ("anyOf", "oneOf") and all("description" in s for s in error.validator_value):
        return f"expected {' or '.join(s['description'] for s in error.validator_value)}, got {_shown(error.instance)}"
    if error.validator in ("minItems", "minProperties"):
        return "must not be empty"
    message = error.message  # jsonschema quotes the whole value: a long one is cut
    return message if len(message) <= 4 * MAX_VALUE_CHARS else message[:4 * MAX_VALUE_CHARS - 3] + "..."


def validate(instance: Any, schema: str | dict, source: str, *, fill_defaults: bool = True) -> Any:
    """Check `instance` against a schema (a name in workflow/schemas/ or the schema itself), filling
    its defaults in; the first problem is one ConfigError line naming `source` and the key."""
    schema = load_schema(schema) if isinstance(schema, str) else schema
    validator = _validator_class(fill_defaults)(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        from jsonschema.exceptions import best_match

        best = best_match(errors)
        raise ConfigError(f"{source}: {key_path(best.absolute_path)}: {_describe(best)}")
    return instance


def validated_file(path: Path, schema: str) -> Any:
    """A YAML file checked against a named schema, its defaults filled in, as `validate` gives it.

    The result is remembered in the cache directory under the hashes of the file and the schema,
    so a job process that reads an unchanged file again (the variant registry) skips jsonschema:
    its import alone is ~0.15 s of each job on the lent GPU's host."""
    path = Path(path)
    try:
        key = hashlib.sha256(path.read_bytes() + b"\0" + (SCHEMAS_DIR / f"{schema}.schema.yaml").read_bytes())
    except OSError:  # a missing file: read_yaml_file says so in its own words
        return validate(read_yaml_file(path), schema, path.name)
    memo = cache_dir() / "validated" / f"{schema}-{key.hexdigest()}.json"
    try:
        return json.loads(memo.read_text())
    except (OSError, ValueError):
        pass
    document = validate(read_yaml_file(path), schema, path.name)
    try:
        write_json_atomic(memo, document)
    except (OSError, ValueError, TypeError):  # a read-only cache, or a value JSON cannot hold: validate each time
        pass
    return document
