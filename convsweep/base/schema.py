"""JSON Schema validation of the project's files, with one error style: `file: key.path: what was expected`.

A YAML file a person edits (experiments.yaml, the variant registry) is checked with `yaml_file`: its
errors then say `file:line: key.path: ...`, name an unknown key itself, and add the nearest allowed
name or value where one is close (`did_you_mean`).

experiments.yaml, bench files, the variant registry and result JSONs are each described by a
schema in workflow/schemas/ (defaults live there too, as Snakemake's `validate` expects). Checks
a schema cannot express (a variant name the registry must know, a layer the network must have)
stay in code and raise the same one-line ConfigError. The sweep's axes are declared once, in
convsweep.base.axes: load_schema adds their properties to the experiments and result schemas, and
schema_file writes that effective schema where Snakemake's validate can read it.
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .axes import AXES
from .errors import ConfigError
from .fileio import SealedCache, write_atomic
from .paths import SCHEMAS_DIR, cache_dir, relative_to_root
from .yamlio import ANY, MAX_DEPTH, MAX_NODES, line_of, read_yaml_file

if TYPE_CHECKING:
    import jsonschema


def _axis_properties(name: str) -> list[tuple[str, dict, list[str]]]:
    """Where a schema describes the sweep's axes (convsweep.base.axes), which its file leaves out: (the
    path of an object schema under $defs, the axes' properties it gains, those of them it requires)."""
    if name == "experiments":  # a list of values per axis, required where the axis has no default list
        return [("experiment", {axis.key: axis.config_schema() for axis in AXES},
                 [axis.key for axis in AXES if axis.config_default is None])]
    if name == "result":  # a job's cell and each measurement's setting: one value per axis
        return [(spec, {axis.name: axis.result_schema() for axis in AXES},
                 [axis.name for axis in AXES if axis.required]) for spec in ("job_spec", "spec")]
    return []


@functools.cache
def load_schema(name: str) -> dict:
    """workflow/schemas/<name>.schema.yaml, read once per process, with the axes' properties added
    where it describes them (experiments.yaml's lists, the result's specs)."""
    schema = read_yaml_file(SCHEMAS_DIR / f"{name}.schema.yaml")
    for definition, properties, required in _axis_properties(name):
        target = schema["$defs"][definition]
        target["properties"].update(properties)
        target["required"] = [*target.get("required", []), *required]
    return schema


def schema_file(name: str) -> Path:
    """The effective schema (load_schema's) as a JSON file in the cache directory, for a reader that
    takes a path: Snakemake's validate. Written once per content; its name holds the content's hash."""
    text = json.dumps(load_schema(name), indent=1, sort_keys=True) + "\n"
    path = cache_dir() / "schemas" / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.schema.json"
    try:  # checked, not trusted for being there: a changed one would change what a sweep may say
        unchanged = path.is_file() and not path.is_symlink() and path.read_text() == text
    except (OSError, UnicodeDecodeError):
        unchanged = False
    if not unchanged:
        write_atomic(path, text)  # a rename: it replaces whatever was at the path, a link included
    return path


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


def at(source: str, keys, yaml_file: Path | None = None, value: Any = ANY) -> str:
    """`file:14: experiments.e.batches` where the YAML file holds `value` (or anything, by default) at
    `keys`, else `file: experiments.e.batches`: how an error line begins."""
    line = line_of(yaml_file, list(keys), value) if yaml_file is not None else None
    return f"{source}{'' if line is None else f':{line}'}: {key_path(keys)}"


# difflib's ratio, 2 x matching characters / both lengths: 0.6 takes 'batchs' -> 'batches' (0.92) and
# 'fst' -> 'fast' (0.86), not 'fst' -> 'full' (0.29). Beside the nearest, only names about as near are
# named ('conv3' -> conv1 or conv2, both 0.8), not every one past the cutoff ('max_nosie' -> max_samples, 0.6).
SUGGESTION_CUTOFF = 0.6
SUGGESTION_SPREAD = 0.1
MAX_SUGGESTIONS = 3
_MAX_SUGGESTED_CHARS = 100  # longer words are no typo of a name; difflib's cost grows with their length


def did_you_mean(word: Any, choices: Iterable, shown=str) -> str:
    """The end of an error line that names the few `choices` nearest to `word`, each as `shown` writes it
    (`; did you mean 'batches'?`); '' where none is close, or `word` is no string."""
    if not isinstance(word, str) or len(word) > _MAX_SUGGESTED_CHARS:
        return ""
    names = {choice for choice in choices if isinstance(choice, str) and choice != word}
    scored = sorted(((difflib.SequenceMatcher(None, word, name).ratio(), name) for name in names),
                    key=lambda pair: (-pair[0], pair[1]))
    if not scored or scored[0][0] < SUGGESTION_CUTOFF:
        return ""
    least = max(SUGGESTION_CUTOFF, scored[0][0] - SUGGESTION_SPREAD)
    close = [f"'{shown(name)}'" for ratio, name in scored[:MAX_SUGGESTIONS] if ratio >= least]
    return f"; did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1]) + ' or ' + close[-1]}?"


MAX_VALUE_CHARS = 60  # of a value quoted in an error line: a whole result section would drown the line
MAX_STRING_CHARS = 10_000  # any string of a checked document: far above every schema's maxLength

_BOUNDS = {"minimum": "at least", "maximum": "at most",
           "exclusiveMinimum": "more than", "exclusiveMaximum": "less than"}
# Validators whose jsonschema message names schema keys only, never the instance's value.
_OWN_MESSAGES = ("required", "dependentRequired")


def _shown(value: Any) -> str:
    """At most MAX_VALUE_CHARS of `value` as JSON; the encoder runs lazily, so a value that expands to
    millions of items costs as much as its first few."""
    if isinstance(value, str):
        value = value[:MAX_VALUE_CHARS + 1]
    text, chunks = "", json.JSONEncoder(default=str).iterencode(value)
    try:
        for chunk in chunks:
            text += chunk[:MAX_VALUE_CHARS + 1]
            if len(text) > MAX_VALUE_CHARS:
                break
    except ValueError:  # a value that contains itself
        text += "..."
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def _cut(message: str) -> str:
    return message if len(message) <= 4 * MAX_VALUE_CHARS else message[:4 * MAX_VALUE_CHARS - 3] + "..."


def _located(error: jsonschema.ValidationError, suggest: bool) -> tuple[list, Any, str]:
    """(the key path, the value there, what was expected) of one error. With `suggest`, an unknown key
    is named itself (its line is the one to fix) with the nearest keys the schema has at that place,
    and a value outside an enum with the nearest allowed ones."""
    keys, instance = list(error.absolute_path), error.instance
    if suggest and error.validator == "additionalProperties" and isinstance(instance, dict):
        schema = cast(Mapping[str, Any], error.schema)  # the object schema the key is not allowed in
        unknown = next((key for key in instance if key not in schema.get("properties", {})
                        and not any(re.search(p, str(key)) for p in schema.get("patternProperties", {}))), None)
        if unknown is not None:
            return [*keys, unknown], instance[unknown], \
                "unknown key" + did_you_mean(unknown, schema.get("properties", {}))
    what = _describe(error)
    if suggest and error.validator == "enum":
        what += did_you_mean(instance, cast(list, error.validator_value))
    return keys, instance, what


def _describe(error: jsonschema.ValidationError) -> str:
    """What was expected, from the failing keyword and its value: jsonschema's own message quotes the
    whole instance, which for a large one is megabytes."""
    # A validator's error has its instance, its keyword's value and (but for a `false` subschema) an object schema.
    kind, expected, instance = error.validator, cast(Any, error.validator_value), cast(Any, error.instance)
    if kind == "additionalProperties":  # the message lists the unknown keys, never their values
        return _cut(error.message.replace("Additional properties are not allowed", "unknown key"))
    if kind in _OWN_MESSAGES:
        return _cut(error.message)
    if kind == "type":
        return f"expected {expected}, got {_shown(instance)}"
    if kind == "enum":
        return f"expected one of {expected}, got {_shown(instance)}"
    if kind == "const":
        return f"expected {json.dumps(expected)}, got {_shown(instance)}"
    if kind in ("anyOf", "oneOf") and all("description" in s for s in expected):
        return f"expected {' or '.join(s['description'] for s in expected)}, got {_shown(instance)}"
    if kind in ("minItems", "minProperties", "minLength") and expected == 1:
        return "must not be empty"
    if kind in ("minItems", "maxItems", "minProperties", "maxProperties", "minLength", "maxLength"):
        unit = {"Ite": "items", "Pro": "keys", "Len": "characters"}[kind[3:6]]
        return f"expected at {'least' if kind.startswith('min') else 'most'} {expected:,} {unit}, got {len(instance):,}"
    if kind == "pattern":  # a schema with a pattern says in its description what the pattern allows
        schema = cast(Mapping[str, Any], error.schema)
        return f"expected {schema.get('description') or 'a string matching ' + expected}, got {_shown(instance)}"
    if kind in _BOUNDS:
        return f"expected {_BOUNDS[kind]} {expected:,}, got {_shown(instance)}"
    if kind == "uniqueItems":
        return f"expected no repeated items, got {_shown(instance)}"
    if kind is None:  # a `false` subschema
        return f"not allowed here, got {_shown(instance)}"
    return f"expected a value its schema's {kind} {_shown(expected)} allows, got {_shown(instance)}"


def check_size(instance: Any, source: str, max_nodes: int = MAX_NODES, max_chars: int = MAX_STRING_CHARS,
               yaml_file: Path | None = None) -> None:
    """Refuse, as one ConfigError line, a document of more than `max_nodes` values (keys count, and a
    container repeated by a YAML alias counts each time), nested past MAX_DEPTH, holding a string of more
    than `max_chars` characters, or containing itself. jsonschema walks every repetition, so this runs
    first; sizes are memoised per container, and it stops at the first container past the bound. With
    `yaml_file`, the line names where in it."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(value: Any, path: list) -> int:
        if isinstance(value, str):
            if len(value) > max_chars:
                raise ConfigError(f"{at(source, path, yaml_file)}: a string of {len(value):,} characters; "
                                  f"at most {max_chars:,}")
            return 1
        if not isinstance(value, (dict, list, tuple)):
            return 1
        if id(value) in sizes:
            return sizes[id(value)]
        if id(value) in open_ids:
            raise ConfigError(f"{at(source, path, yaml_file)}: contains itself (a YAML alias inside its own anchor)")
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{at(source, path, yaml_file)}: nested more than {MAX_DEPTH} levels deep")
        open_ids.add(id(value))
        total, is_map = 1, isinstance(value, dict)
        for key, item in cast(dict, value).items() if is_map else enumerate(value):
            total += size(item, [*path, key]) + (size(key, path) if is_map else 0)
            if total > max_nodes:
                raise ConfigError(f"{at(source, path, yaml_file)}: more than {max_nodes:,} values "
                                  "(a list this long, or YAML aliases repeating one)")
        open_ids.discard(id(value))
        sizes[id(value)] = total
        return total

    size(instance, [])


def check_finite(instance: Any, source: str, yaml_file: Path | None = None) -> None:
    """Refuse, as one ConfigError line naming the key (and with `yaml_file`, its line), the first NaN or
    infinity in document order (YAML's .nan and .inf, a key among them). JSON Schema cannot: every
    comparison with NaN is false, so `minimum` and `maximum` pass it, and a `number` without a bound
    passes infinity. Iterative, each container once (a YAML alias repeats one)."""
    if isinstance(instance, float):
        if not math.isfinite(instance):
            raise ConfigError(f"{at(source, [], yaml_file, instance)}: {_not_finite(instance)}")
        return
    seen: set[int] = set()
    stack: list[tuple[list, Iterator[tuple[Any, Any]]]] = [([], _items(instance))]
    while stack:
        path, items = stack[-1]
        for key, value in items:
            if isinstance(key, float) and not math.isfinite(key):
                raise ConfigError(f"{at(source, path, yaml_file)}: a key: {_not_finite(key)}")
            if isinstance(value, float):
                if not math.isfinite(value):
                    raise ConfigError(f"{at(source, [*path, key], yaml_file, value)}: {_not_finite(value)}")
            elif isinstance(value, (dict, list, tuple)) and id(value) not in seen:
                seen.add(id(value))
                stack.append(([*path, key], _items(value)))
                break
        else:
            stack.pop()


def _items(value: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) of a mapping, (index, item) of a sequence, nothing of a scalar: as an iterator, so
    check_finite's walk resumes a container where it went down into a child."""
    if isinstance(value, dict):
        return iter(value.items())
    return enumerate(value) if isinstance(value, (list, tuple)) else iter(())


def _not_finite(number: float) -> str:
    spelled = ".nan" if math.isnan(number) else ".inf" if number > 0 else "-.inf"
    return f"expected a finite number, got {spelled}"


def validate(instance: Any, schema: str | dict, source: str, *, fill_defaults: bool = True,
             max_nodes: int | None = None, yaml_file: Path | None = None) -> Any:
    """Check `instance` against a schema (a name in workflow/schemas/ or the schema itself), filling
    its defaults in; the first problem is one ConfigError line naming `source` and the key. With
    `max_nodes`, a document larger than that (see check_size) is refused before the schema is applied.
    NaN and infinities are refused before it too (check_finite): no schema can refuse NaN.
    With `yaml_file` (the YAML file `instance` was read from), the line names the key's line there, an
    unknown key is named itself, and an unknown key or enum value gets the nearest allowed ones."""
    if max_nodes is not None:
        check_size(instance, source, max_nodes, yaml_file=yaml_file)
    check_finite(instance, source, yaml_file)
    schema = load_schema(schema) if isinstance(schema, str) else schema
    validator = _validator_class(fill_defaults)(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        from jsonschema.exceptions import best_match

        keys, value, what = _located(best_match(errors), suggest=yaml_file is not None)
        raise ConfigError(f"{at(source, keys, yaml_file, value)}: {what}")
    return instance


def validated_file(path: Path, schema: str) -> Any:
    """A YAML file checked against a named schema, its defaults filled in, as `validate` gives it; its
    errors name the file from the checkout (or absolute, outside it) and the line.

    The result is remembered in the cache directory under the hashes of the file and the schema,
    so a job process that reads an unchanged file again (the variant registry) skips jsonschema:
    its import alone is ~0.15 s of each job on the lent GPU's host."""
    path = Path(path)
    try:
        key = hashlib.sha256(path.read_bytes() + b"\0" + (SCHEMAS_DIR / f"{schema}.schema.yaml").read_bytes()
                             + json.dumps(_axis_properties(schema), sort_keys=True).encode())
    except OSError:  # a missing file: read_yaml_file says so in its own words
        return validate(read_yaml_file(path), schema, relative_to_root(path), yaml_file=path)
    # Sealed (fileio.SealedCache): a memo changed on disk (a variant's precision, and so its tolerance) is made
    # again, never trusted.
    cache, name = SealedCache(cache_dir()), f"validated/{schema}-{key.hexdigest()}.sealed"
    found = cache.read(name, key.hexdigest())
    if found is not None:
        try:
            return json.loads(bytes(found[1]))
        except ValueError:
            cache.discard(name)
    document = validate(read_yaml_file(path), schema, relative_to_root(path), yaml_file=path)
    try:
        cache.write(name, key.hexdigest(), {}, json.dumps(document, allow_nan=False).encode())
    except (OSError, ValueError, TypeError):  # a read-only cache, or a value JSON cannot hold: validate each time
        pass
    return document
