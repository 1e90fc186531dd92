"""JSON Schema validation of the project's files, with one error style: `file: key.path: what was expected`.

experiments.yaml, bench files, the variant registry and result JSONs are each described by a
schema in workflow/schemas/ (defaults live there too, as Snakemake's `validate` expects). Checks
a schema cannot express (a variant name the registry must know, a layer the network must have)
stay in code and raise the same one-line ConfigError.
"""
from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from .errors import ConfigError
from .paths import SCHEMAS_DIR
from .yamlio import read_yaml_file


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """workflow/schemas/<name>.schema.yaml, read once per process."""
    return read_yaml_file(SCHEMAS_DIR / f"{name}.schema.yaml")


def _validator_filling_defaults():
    """A validator that also writes schema defaults into the instance, as Snakemake's validate does."""
    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = json.loads(json.dumps(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


_FILLING = _validator_filling_defaults()


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
    if error.validator in ("minItems", "minProperties"):
        return "must not be empty"
    message = error.message  # jsonschema quotes the whole value: a long one is cut
    return message if len(message) <= 4 * MAX_VALUE_CHARS else message[:4 * MAX_VALUE_CHARS - 3] + "..."


def validate(instance: Any, schema: str | dict, source: str, *, fill_defaults: bool = True) -> Any:
    """Check `instance` against a schema (a name in workflow/schemas/ or the schema itself), filling
    its defaults in; the first problem is one ConfigError line naming `source` and the key."""
    schema = load_schema(schema) if isinstance(schema, str) else schema
    validator = (_FILLING if fill_defaults else jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"{source}: {key_path(best.absolute_path)}: {_describe(best)}")
    return instance
