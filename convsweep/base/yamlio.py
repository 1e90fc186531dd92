"""Reading the project's YAML files with libyaml's C loader when PyYAML has it, strictly and within bounds.

The pure-Python loader cost ~0.1 s of every job process (the variant registry, the network).
PyYAML keeps the last of two equal keys without a word and lets aliases repeat an anchor's
contents without limit (a "billion laughs" document is a few hundred bytes), so the composed
node tree is checked before anything is constructed: a duplicate key, an alias that refers to
itself, a document that expands past MAX_NODES values or nests past MAX_DEPTH is one ConfigError
line naming the file and the line. line_of finds, for an error about the constructed document, the
line of the key or list item it is about.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import yaml

from .errors import ConfigError

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The largest file convsweep reads (kernels/variants.yaml) is ~20 KB; libyaml composes 256 KB of the
# densest YAML (a flow list of 1-digit numbers) in ~0.4 s, so a refusal past MAX_NODES stays that fast.
MAX_FILE_BYTES = 256_000
MAX_NODES = 100_000  # values after aliases are expanded: the default sweep has ~150, the registry ~3,000
MAX_DEPTH = 64  # nesting: the schemas go 8 deep; this also keeps the checks' recursion far from Python's limit
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SHOWN_KEY_CHARS = 60
ANY = object()  # line_of's `value` when any value will do


def load_yaml(text: str, source: str = "<string>"):
    """yaml.safe_load through the C loader where available, refusing what `_check_tree` refuses;
    any problem is one ConfigError line `source:line: ...`."""
    return _load(text, source, lambda loader, root, data: data)


def read_yaml_file(path: Path, max_bytes: int = MAX_FILE_BYTES):
    """A YAML file's contents; a missing, oversized or unparsable file is one ConfigError line naming
    it (and the line)."""
    path = Path(path)
    return load_yaml(_read_text(path, max_bytes), str(path))


def line_of(path: Path, keys: Sequence, value: Any = ANY) -> int | None:
    """The line of the key (or list item) at `keys` in the YAML file at `path`, for an error about it: a
    key path as jsonschema gives it, with a << merge or an alias followed as the loader follows it. None
    where the file has nothing at `keys`, holds another scalar there than `value` (the checked document
    may be the file with Snakemake's --config overrides in it), or cannot be read now. Read again, within
    the same bounds: it runs only for an error, so reading a file costs nothing more when it is fine."""
    try:
        return _load(_read_text(Path(path), MAX_FILE_BYTES), str(path),
                     lambda loader, root, data: _walk(loader, root, data, keys, value))
    except (ConfigError, OSError, UnicodeDecodeError):
        return None


def _read_text(path: Path, max_bytes: int) -> str:
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    size = path.stat().st_size
    if size > max_bytes:  # checked before reading: a 50 MB file is refused without parsing it
        raise ConfigError(f"{path}: {size:,} bytes; a convsweep YAML file holds at most {max_bytes:,}")
    return path.read_text()


def _load(text: str, source: str, then):
    """then(loader, root node, constructed document) once the tree passed `_check_tree`; (.., None, None)
    for an empty document. Construction flattens << merges into the mapping nodes, so the node tree
    `then` sees has the pairs the document's dicts were made of."""
    loader = _SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return then(loader, None, None)
        _check_tree(node, source, text)
        return then(loader, node, loader.construct_document(node))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:  # PyYAML's constructor recurses per level; MAX_DEPTH should stop it first
        raise ConfigError(f"{source}: nested too deeply") from None
    finally:
        loader.dispose()


def _walk(loader, node: yaml.Node | None, data: Any, keys: Sequence, value: Any) -> int | None:
    """line_of's walk down the node tree and the document made from it, side by side."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for key in keys:
        if isinstance(node, yaml.MappingNode) and isinstance(data, dict):
            # The last pair with this key is the one the dict kept (a merge's pairs come first).
            pair = next(((k, v) for k, v in reversed(node.value) if isinstance(k, yaml.ScalarNode)
                         and _same(loader.construct_object(k), key)), None)
            if pair is None or key not in data:
                return None
            line, node, data = pair[0].start_mark.line + 1, pair[1], data[key]
        elif isinstance(node, yaml.SequenceNode) and isinstance(data, list) and isinstance(key, int) \
                and 0 <= key < min(len(node.value), len(data)):
            node, data = node.value[key], data[key]
            line = node.start_mark.line + 1
        else:
            return None
    if value is ANY:
        return line
    if isinstance(node, yaml.CollectionNode):  # what a checker added inside (defaults) need not be in the file
        return line if isinstance(value, (dict, list, tuple)) else None
    return line if _same(data, value) else None


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (1, 1.0 and true are three values to a YAML file); NaN is NaN."""
    if type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and a != a and b != b)


def _check_tree(root: yaml.Node, source: str, text: str) -> None:
    """Refuse duplicate keys, self-referring aliases, a nesting deeper than MAX_DEPTH and more than
    MAX_NODES values once aliases (and << merges) are expanded. Sizes are memoised per node, so the
    check is linear in the document however often an anchor is repeated."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(f"{source}:{node.start_mark.line + 1}: an alias refers to its own anchor's contents")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}:{node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
        open_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            _check_duplicates(node, source)
        total = 1
        for child in _children(node):
            total += size(child, depth + 1)
            if total > MAX_NODES:
                raise ConfigError(_too_big(node, source, text))
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root, 0)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def _check_duplicates(node: yaml.MappingNode, source: str) -> None:
    """Two equal scalar keys in one mapping; a << merge's keys may be overridden, as YAML means them to be."""
    seen = set()
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
            continue
        if (key.tag, key.value) in seen:
            shown = key.value if len(key.value) <= _SHOWN_KEY_CHARS else key.value[:_SHOWN_KEY_CHARS - 3] + "..."
            raise ConfigError(f"{source}:{key.start_mark.line + 1}: duplicate key '{shown}'")
        seen.add((key.tag, key.value))


def _too_big(node: yaml.Node, source: str, text: str) -> str:
    """The line for a collection past MAX_NODES values: its first alias where aliases blow it up (an
    alias inside its text), else the collection's own line."""
    start, end = node.start_mark.index, node.end_mark.index
    # A parsed event has its marks.
    alias = next((event for event in yaml.parse(text, Loader=_SAFE_LOADER) if isinstance(event, yaml.AliasEvent)
                  and start <= cast(yaml.Mark, event.start_mark).index < end), None)
    if alias is not None:
        line = cast(yaml.Mark, alias.start_mark).line
        return f"{source}:{line + 1}: YAML aliases from here expand to more than {MAX_NODES:,} values"
    return f"{source}:{node.start_mark.line + 1}: more than {MAX_NODES:,} values in one collection"
