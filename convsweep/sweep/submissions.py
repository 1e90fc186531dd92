"""A course's submissions (docs/course.md): `submissions/<id>/`, a variants.yaml in the shipped schema beside the
student's .cu files, and no host code. Which folders are submissions, each one read strictly (files, registry,
expressions, and the path rules its sources and their #includes keep), and the build folder NVRTC compiles it
from: byte for byte the files that were checked, beside the shipped headers."""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NoReturn, cast

from convsweep.base.errors import ConfigError, ShapeError
from convsweep.base.paths import KERNELS_DIR, REGISTRY_PATH, relative_to_root, safe_name
from convsweep.model.network import Network
from convsweep.model.variants import VARIANTS_ENV, Variant, load_registry, read_registry

REGISTRY_NAME = "variants.yaml"
ID_MAX_CHARS = 32
# Letters and digits in runs joined by one '_', '-' or '.', starting with a letter: a netid or a team name. Its
# class prefix (class_prefix) is then an identifier with no '__' and no '_' at its end, so the first '__' of a
# class-wide name is where the id ends: no two (id, name) pairs make one name.
_ID = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[._-][A-Za-z0-9]+)*")
SEPARATOR = "__"
MAX_NAME_CHARS = 64  # a variant name, in the registry's and experiments.yaml's schemas
DEVICE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp")
NOTE_SUFFIXES = (".md", ".txt")  # read by people, never compiled
_FILE_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")  # every file's name: includable, one line when shown
MAX_FILES = 200  # files and folders
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 8
CHECK_BATCHES = (1, 10_000)  # the batches a build fixes and the seeds' largest: each expression is evaluated at both


@dataclass(frozen=True)
class Found:
    """A folder under the class folder: a submission's id and path, or why it cannot be one."""

    id: str
    path: Path
    refusal: str | None = None


@dataclass(frozen=True)
class Submission:
    """One submission, checked: its variants by the names its registry gives them, the submission files each
    one's build reads (its source first), and the checked bytes of every such file."""

    id: str
    path: Path
    shown: str  # the folder as the check names it
    variants: dict[str, Variant]
    reads: dict[str, tuple[str, ...]]
    texts: dict[str, bytes]

    def class_name(self, name: str) -> str:
        return class_name(self.id, name)

    def class_variants(self) -> dict[str, Variant]:
        """The variants under their class-wide names (`<id>__<name>`), as a course's sweep knows them."""
        return {self.class_name(name): dataclasses.replace(var, name=self.class_name(name))
                for name, var in self.variants.items()}


def class_prefix(submission_id: str) -> str:
    return re.sub(r"[.-]", "_", submission_id)


def class_name(submission_id: str, name: str) -> str:
    """`jdoe2__tiled`: the variant `name` of submission `submission_id`, unique in the class."""
    return f"{class_prefix(submission_id)}{SEPARATOR}{name}"


def shipped_headers() -> dict[str, Path]:
    """The headers of kernels/ a submission may include by plain name (`#include "common.cuh"`)."""
    return {path.name: path for path in sorted(KERNELS_DIR.glob("*.cuh")) if path.is_file()}


def find_submissions(folder: Path) -> list[Found]:
    """The submissions under `folder`, by id: each folder in it (names starting with '.' and plain files are
    passed over), or `folder` itself where it holds a variants.yaml. A folder whose name is no id, a link,
    or two ids whose class prefixes are one are refusals, each on its own Found."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: expected a folder of submissions (docs/course.md), got no such folder")
    if (folder / REGISTRY_NAME).exists() or (folder / REGISTRY_NAME).is_symlink():
        candidates = [(Path(os.path.abspath(folder)).name, folder)]
    else:
        candidates = [(entry.name, entry) for entry in sorted(folder.iterdir())
                      if not entry.name.startswith(".") and (entry.is_symlink() or entry.is_dir())]
    found: list[Found] = []
    prefixes: dict[str, list[str]] = {}
    for name, path in candidates:
        refusal = None
        if path.is_symlink():
            refusal = f"{path}: a link, not a folder: a submission is a folder of plain files"
        elif len(name) > ID_MAX_CHARS or not _ID.fullmatch(name):
            refusal = (f"{path}: not a submission id (letters and digits in runs joined by one '_', '-' or '.', "
                       f"starting with a letter, at most {ID_MAX_CHARS} characters)")
        else:
            prefixes.setdefault(class_prefix(name).lower(), []).append(name)
        found.append(Found(name if refusal is None else ascii(name)[1:-1][:80], path, refusal))
    for i, item in enumerate(found):
        others = [name for name in prefixes.get(class_prefix(item.id).lower(), []) if name != item.id]
        if item.refusal is None and others:
            found[i] = dataclasses.replace(item, refusal=(
                f"{item.path}: its variants' class-wide names ({class_prefix(item.id)}{SEPARATOR}...) would be "
                f"those of '{others[0]}' too: rename one of the folders"))
    return found


def read_submission(path: Path, submission_id: str, shown: str, network: Network | None) -> Submission:
    """One submission, checked without a GPU: its files, its registry (the shipped schema and checks), its
    variants' class-wide names and expressions (evaluated on `network`'s conv layers; without one, not: a sweep
    meets them at the settings it measures), and the path rules of their sources; the first problem is one
    ConfigError line naming the file and the key or line."""
    path = Path(path)
    files = _plain_files(path, shown)
    if REGISTRY_NAME not in files:
        raise ConfigError(f"{shown}/{REGISTRY_NAME}: expected the submission's registry (docs/course.md), got no such file")
    registry_shown = f"{shown}/{REGISTRY_NAME}"
    try:
        variants = read_registry(path / REGISTRY_NAME, registry_shown)
    except ConfigError as e:  # the schema names the file from the checkout; the checks in code by `shown`
        raise ConfigError(_renamed(str(e), relative_to_root(path / REGISTRY_NAME), registry_shown)) from None
    taken = load_registry()
    # A variant without `__` stands as its own submission (analysis.leaderboard.submission_of): an id that is a
    # registered variant's name would merge a student's standing with a shipped baseline's.
    if class_prefix(submission_id).lower() in {name.lower() for name in taken}:
        raise ConfigError(f"{shown}: the submission id {submission_id!r} is the name of a variant convsweep has "
                          f"({relative_to_root(REGISTRY_PATH)} or ${VARIANTS_ENV}): rename the folder")
    reads: dict[str, tuple[str, ...]] = {}
    texts: dict[str, bytes] = {}
    for name, var in variants.items():
        where = f"{registry_shown}: {name}"
        if var.is_cpu:
            raise ConfigError(f"{where}.cpu: expected a GPU variant (source and launches); the CPU reference is shipped")
        full = class_name(submission_id, name)
        if len(full) > MAX_NAME_CHARS:
            raise ConfigError(f"{where}: its class-wide name {full} is {len(full)} characters; at most "
                              f"{MAX_NAME_CHARS} (shorten the variant's name)")
        if full in taken:
            raise ConfigError(f"{where}: its class-wide name {full} is a variant convsweep has already "
                              f"({relative_to_root(REGISTRY_PATH)} or ${VARIANTS_ENV})")
        try:
            if network is not None:
                check_expressions(var, network)
        except ConfigError as e:  # evaluate names the file as the shipped registry's name
            raise ConfigError(_renamed(str(e), REGISTRY_PATH.name, registry_shown)) from None
        source = Path(str(var.source)).name
        reads[name] = include_closure(path, source, files, shown, texts)
    return Submission(submission_id, path, shown, variants, reads, texts)


def _renamed(message: str, named: str, shown: str) -> str:
    """An error line about the file `shown`, beginning with it: as it begins already, in place of the file as
    `named`, or in front of a line that names no file."""
    if message.startswith(shown):
        return message
    return shown + message[len(named):] if message.startswith(named + ":") else f"{shown}: {message}"


def _plain_files(root: Path, shown: str) -> frozenset[str]:
    """The submission's files, relative, '/'-separated: plain files of the kinds a submission holds, of plain
    names, within bounds; a link, a special file or anything else (host code: .py, .so, .sh, a Makefile) is
    refused, naming it, before any file is read."""
    found: list[str] = []
    others: list[str] = []
    todo, entries_seen = [(root, "", 0)], 0
    while todo:
        folder, prefix, depth = todo.pop()
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel, entries_seen = prefix + entry.name, entries_seen + 1
                where = f"{shown}/{ascii(rel)[1:-1][:200]}"
                if entries_seen > MAX_FILES:
                    raise ConfigError(f"{shown}: more than {MAX_FILES} files and folders")
                if entry.is_symlink():
                    target = ascii(os.readlink(entry.path))[1:-1][:200]
                    raise ConfigError(f"{where}: a link (to {target}): a submission holds plain files only")
                if not _FILE_NAME.fullmatch(entry.name):
                    raise ConfigError(f"{where}: expected a name of letters, digits and _ . + - (not starting with .)")
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= MAX_DEPTH:
                        raise ConfigError(f"{where}: folders nested more than {MAX_DEPTH} deep")
                    todo.append((Path(entry.path), rel + "/", depth + 1))
                    continue
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    raise ConfigError(f"{where}: not a plain file: a submission holds plain files only")
                if info.st_size > MAX_FILE_BYTES:
                    raise ConfigError(f"{where}: {info.st_size:,} bytes; at most {MAX_FILE_BYTES:,} a file")
                if rel != REGISTRY_NAME and not rel.endswith(DEVICE_SUFFIXES + NOTE_SUFFIXES):
                    others.append(rel)
                found.append(rel)
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise ConfigError(f"{shown}/{others[0]}{more}: not device code: a submission holds its {REGISTRY_NAME}, "
                          f"{', '.join(DEVICE_SUFFIXES)} files and {'/'.join(NOTE_SUFFIXES)} notes, no host code")
    # case folded: on a disk that folds case (macOS) the build folder could not hold both
    shipped = {name.lower(): name for name in shipped_headers()}
    if shadowing := sorted(rel for rel in found if rel.lower() in shipped):
        raise ConfigError(f"{shown}/{shadowing[0]}: takes the name of the shipped kernels/{shipped[shadowing[0].lower()]}, "
                          "which sources include by that name: rename it")
    return frozenset(found)


def check_expressions(var: Variant, network: Network) -> None:
    """Every expression of `var` evaluated where a sweep would: its restrictions over its whole grid, its
    constraints, launches, workspace and prepared bytes for each setting at each conv layer of `network` it
    fits (at CHECK_BATCHES); a bad one is evaluate's ConfigError line. A variant that fits none is refused."""
    combos = var.all_combinations()
    fits, reasons = 0, []
    for layer in network.conv_layers:
        for batch in CHECK_BATCHES:
            try:
                shape = network.variant_shape(layer, var.fuses, batch, var.absorbs_input)
            except ShapeError as e:
                reasons.append(f"{layer.name}: {e}")
                break
            for params in combos:
                try:
                    var.check_shape(shape, params)
                except ShapeError as e:
                    reasons.append(f"{layer.name}: {e}")
                    continue
                fits += 1
                var.launch_plan(shape, params)
                var.prepare_plan(shape, params)
                var.workspace_bytes(shape, params)
                var.prepared_bytes(shape, params)
    if not fits:
        raise ConfigError(f"{REGISTRY_PATH.name}: {var.name}: fits no conv layer of "
                          f"{relative_to_root(network.path)} ({reasons[0] if reasons else 'it has none'})")


def check_builds(var: Variant, network: Network) -> list[dict]:
    """The macros `var` is built with by the check: its defaults, and where it fixes the layer shape at compile
    time, one build per conv layer of `network` it fits, as a sweep builds it."""
    params = var.defaults()
    if not var.compile_time:
        return [var.defines(params, None)]
    builds: list[dict] = []
    for layer in network.conv_layers:
        try:
            shape = network.variant_shape(layer, var.fuses, 1, var.absorbs_input)
            var.check_shape(shape, params)
        except ShapeError:
            continue
        if (macros := var.defines(params, shape)) not in builds:
            builds.append(macros)
    if not builds:
        raise ConfigError(f"{var.name}: fixes the layer shape at compile time ({', '.join(var.compile_time)}) and at "
                          f"its defaults fits no conv layer of {relative_to_root(network.path)}")
    return builds


# -- the path rules: every file a source includes, found as NVRTC finds it ----------------------------------

_HEADER_NAME = re.compile(r"[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)*")


def include_closure(root: Path, source: str, files: frozenset[str], shown: str,
                    texts: dict[str, bytes]) -> tuple[str, ...]:
    """`source` and the submission files it includes, transitively, as NVRTC resolves them: "name" from the
    including file's folder, then the submission's top (the include path); a shipped header by its plain name;
    <name> from the submission's top, a shipped header, or CUDA's headers. Anything else, a name with '..' or
    absolute among them, is one ConfigError line naming the file and line. Fills `texts` with what was read."""
    shipped = shipped_headers()
    order, todo = [], [source]
    while todo:
        rel = todo.pop(0)
        if rel in order:
            continue
        order.append(rel)
        if rel not in texts:
            texts[rel] = _read(root / rel)
        for include in scan_includes(texts[rel], f"{shown}/{rel}"):
            where = f"{shown}/{rel}:{include.line}"
            name = _header_name(include, where)
            if include.probe:
                continue  # __has_include asks whether a file is there and reads none
            here = str(PurePosixPath(rel).parent / name)
            candidates = [here, name] if include.quoted else [name]
            if found := next((c for c in candidates if c in files), None):
                todo.append(found)
            elif include.quoted and name not in shipped:
                raise ConfigError(f"{where}: #include \"{name}\": no such file in the submission, nor a shipped "
                                  "header (kernels/*.cuh); CUDA's headers are included with <...>")
    return tuple(order)


def _read(path: Path) -> bytes:
    """A checked file's bytes, never through a link put in its place since (O_NOFOLLOW), within MAX_FILE_BYTES."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: more than {MAX_FILE_BYTES:,} bytes")
    return data


def _header_name(include: Include, where: str) -> str:
    """The include's name, normalized, where it is a relative path of plain names; else the refusal."""
    shown = f'"{include.name}"' if include.quoted else f"<{include.name}>"
    directive = "__has_include" if include.probe else "#include"
    if include.name.startswith("/"):
        raise ConfigError(f"{where}: {directive} {ascii(shown)[1:-1][:100]}: an absolute path; a submission "
                          "includes its own files by relative path")
    if not _HEADER_NAME.fullmatch(include.name):
        raise ConfigError(f"{where}: {directive} {ascii(shown)[1:-1][:100]}: expected a relative path of "
                          "letters, digits and _ . + - parts")
    if ".." in include.name.split("/"):
        raise ConfigError(f"{where}: {directive} {shown}: leaves the submission's folder ('..')")
    return str(PurePosixPath(include.name))


# -- the preprocessor's view of a file: its lines joined, comments and literals passed over, its directives found --

@dataclass(frozen=True)
class Include:
    line: int
    name: str
    quoted: bool  # "name", else <name>
    probe: bool = False  # __has_include(...)


# Directives a submission may use; any other at a line's start is refused (NVRTC's #include_next reads a file).
DIRECTIVES = frozenset({"define", "undef", "include", "if", "ifdef", "ifndef", "elif", "elifdef", "elifndef",
                        "else", "endif", "line", "error", "warning", "pragma"})
_READS_FILES = frozenset({"include", "include_next", "import", "embed"})
_PROBES = frozenset({"__has_include", "__has_include_next"})
_RAW_PREFIXES = frozenset({"R", "u8R", "uR", "UR", "LR"})
_LOOSE_SPLICE = re.compile(r"\\[ \t\f\v]+\n")
_RAW_DELIMITER = re.compile(r'[^\s()\\"]{0,16}')


def scan_includes(data: bytes, shown: str) -> list[Include]:
    """Every file `data` names in an #include or __has_include, read as NVRTC's preprocessor reads it (lines
    joined by '\\' first, then comments, string and raw string literals passed over); conservative where
    compilers differ: an #include anywhere, not only at a line's start, is found. What it cannot read as
    NVRTC would (a trigraph, a lone carriage return, a macro as the file's name, a directive it does not
    know) is one ConfigError line naming `shown` and the line."""
    return _Scanner(data.decode("latin-1"), shown).includes()  # latin-1: one character a byte, as NVRTC reads


class _Scanner:
    def __init__(self, text: str, shown: str):
        self.shown = shown
        if text.startswith("\xef\xbb\xbf"):  # a UTF-8 byte-order mark: NVRTC refuses it; read past it
            text = "   " + text[3:]
        if match := re.search("\r(?!\n)", text):
            raise ConfigError(f"{shown}:{text.count(chr(10), 0, match.start()) + 1}: a carriage return that ends no line")
        text = text.replace("\r\n", "\n")
        for pattern, what in (("\0", "a NUL byte"),
                              (r"\?\?[=/]", "a trigraph (??= or ??/), which compilers read differently"),
                              (_LOOSE_SPLICE.pattern, "a '\\' followed by spaces at a line's end, which compilers "
                                                      "read differently")):
            if match := re.search(pattern, text):
                raise ConfigError(f"{shown}:{text.count(chr(10), 0, match.start()) + 1}: {what}")
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.splices = [m.start() for m in re.finditer(r"\\\n", text)]  # phase 2: each '\' newline removed
        self.s = re.sub(r"\\\n", "", text)
        self.removed_at = [start - 2 * k for k, start in enumerate(self.splices)]
        if (left := self.s.find("\\\n")) >= 0:
            self.refuse(left, "a '\\' at a line's end once lines are joined, which compilers read differently")
        self.found: list[Include] = []

    def original(self, i: int) -> int:
        return i + 2 * bisect.bisect_right(self.removed_at, i)

    def line(self, i: int) -> int:
        return bisect.bisect_left(self.newlines, self.original(i)) + 1

    def refuse(self, i: int, what: str) -> NoReturn:
        raise ConfigError(f"{self.shown}:{self.line(i)}: {what}")

    def includes(self) -> list[Include]:
        s, i, line_start = self.s, 0, True
        while i < len(s):
            c = s[i]
            if c == "\n":
                line_start, i = True, i + 1
            elif c in " \t\f\v":
                i += 1
            elif s.startswith("//", i):
                i = _line_end(s, i)
            elif s.startswith("/*", i):
                end = self.comment_end(i)
                line_start = line_start or "\n" in s[i:end]  # NVRTC: `/* ...\n */ #include` is a directive
                i = end
            elif c == "#" or s.startswith("%:", i):
                i, line_start = self.directive(i, line_start), False
            else:
                i, line_start = self.token(i), False
        return self.found

    def comment_end(self, i: int) -> int:
        end = self.s.find("*/", i + 2)
        if end < 0:
            self.refuse(i, "a /* comment that never ends")
        return end + 2

    def blank(self, i: int) -> int:
        """Past spaces and /* comments (a directive goes on past a comment's line breaks)."""
        s = self.s
        while i < len(s):
            if s[i] in " \t\f\v":
                i += 1
            elif s.startswith("/*", i):
                i = self.comment_end(i)
            else:
                break
        return i

    def directive(self, i: int, line_start: bool) -> int:
        s = self.s
        j = self.blank(i + (1 if s[i] == "#" else 2))
        end = _ident_end(s, j)
        name = s[j:end]
        if name in _READS_FILES - {"include"}:
            self.refuse(i, f"#{name}: a submission includes files with #include alone")
        if name == "include":
            return self.operand(i, self.blank(end), "#include")
        if line_start and name not in DIRECTIVES:
            rest = s[j:j + 1]
            if name or not (rest in ("", "\n") or rest.isdigit() or s.startswith("//", j)):  # '#' alone, a line marker
                self.refuse(i, f"#{ascii(name or rest)[1:-1][:40]}: not a directive a submission may use "
                               f"({', '.join(sorted(DIRECTIVES))})")
        return end

    def operand(self, i: int, j: int, directive: str, probe: bool = False) -> int:
        """The "name" or <name> at j (its directive at i), recorded; a macro there is refused."""
        s = self.s
        if j < len(s) and s[j] in "\"<":
            close = s.find('"' if s[j] == '"' else ">", j + 1)
            newline = s.find("\n", j + 1)
            if close < 0 or 0 <= newline < close:
                self.refuse(i, f"{directive}: the file's name never ends on its line")
            self.found.append(Include(self.line(i), s[j + 1:close], s[j] == '"', probe))
            return close + 1
        self.refuse(i, f"{directive} of a macro or other tokens: write the file's name in quotes or <>")

    def token(self, i: int) -> int:
        s, c = self.s, self.s[i]
        if c.isdigit() or (c == "." and s[i + 1:i + 2].isdigit()):
            return _number_end(s, i)
        if _is_ident(c):
            end = _ident_end(s, i)
            word, after = s[i:end], s[end:end + 1]
            if word in _RAW_PREFIXES and after == '"':
                return self.raw_string(i, end)
            if word in _PROBES:
                j = self.blank(end)
                if not s.startswith("(", j):
                    self.refuse(i, f"{word} without its (file): write the file's name in quotes or <> right after it")
                return self.operand(i, self.blank(j + 1), word, probe=True)
            if word == "import" and s[self.blank(end):self.blank(end) + 1] in ('"', "<"):
                self.refuse(i, "a C++20 header import: a submission includes files with #include")
            return end  # after an encoding prefix (u8, L), its literal is read next as any other
        if c in "\"'":
            return _literal_end(s, i)
        return i + 1

    def raw_string(self, i: int, quote: int) -> int:
        """Past R"delim( ... )delim" (lines are not joined inside one: a join in its span is refused)."""
        s = self.s
        delimiter = cast(re.Match, _RAW_DELIMITER.match(s, quote + 1))  # {0,16}: it matches, if only ''
        if not s.startswith("(", delimiter.end()):
            self.refuse(i, "a raw string literal whose delimiter is not 0 to 16 plain characters and '('")
        close = s.find(f"){delimiter.group()}\"", delimiter.end() + 1)
        if close < 0:
            self.refuse(i, "a raw string literal that never ends")
        end = close + len(delimiter.group()) + 2
        first, last = self.original(i), self.original(end)
        if bisect.bisect_left(self.splices, first) != bisect.bisect_left(self.splices, last):
            self.refuse(i, "a raw string literal holding a '\\' at a line's end")
        return _ident_end(s, end)  # a user-defined literal's suffix


def _is_ident(c: str) -> bool:
    # '$' and bytes past ASCII too: reading more as one identifier than NVRTC does only ever finds more
    # raw strings to be ordinary ones, whose end is their line's
    return c.isalnum() or c in "_$" or ord(c) >= 0x80


def _ident_end(s: str, i: int) -> int:
    while i < len(s) and _is_ident(s[i]):
        i += 1
    return i


def _number_end(s: str, i: int) -> int:
    """Past a preprocessing number (1'000, 0x1p-3, 2.5e+7f)."""
    i += 1
    while i < len(s):
        if _is_ident(s[i]) or s[i] == ".":
            i += 1
        elif s[i] in "+-" and s[i - 1] in "eEpP":
            i += 1
        elif s[i] == "'" and i + 1 < len(s) and _is_ident(s[i + 1]):
            i += 2
        else:
            break
    return i


def _literal_end(s: str, i: int) -> int:
    """Past a string or character literal and its suffix; one that never ends stops at its line's end."""
    quote, j = s[i], i + 1
    while j < len(s) and s[j] != quote and s[j] != "\n":
        j += 2 if s[j] == "\\" else 1
    if j < len(s) and s[j] == quote:
        return _ident_end(s, j + 1)  # "abc"_x, and "abc"R: a suffix, so the "..." after it is no raw string
    return min(j, len(s))


def _line_end(s: str, i: int) -> int:
    end = s.find("\n", i)
    return len(s) if end < 0 else end


# -- the build folder --------------------------------------------------------------------------------------

def build_folder(submission: Submission, parent: Path) -> Path:
    """A folder under `parent` holding the checked bytes of every file the submission's builds read, at their
    places, beside copies of the shipped headers: what NVRTC compiles, so a file changed after the check is
    never built. Named by its contents (`<id>-<digest>`), so an unchanged submission's builds are cache hits;
    made whole under another name and renamed into place. Each copy keeps its original's modification time, so a
    sweep that watches the copies re-measures on an edit, not on a cache made again."""
    origins = {rel: submission.path / rel for rel in sorted({r for reads in submission.reads.values() for r in reads})}
    contents = {rel: submission.texts[rel] for rel in origins}
    origins.update(shipped := shipped_headers())
    contents.update({name: path.read_bytes() for name, path in shipped.items()})
    digest = hashlib.sha256()
    for rel, data in sorted(contents.items()):
        digest.update(f"{rel}\0{len(data)}\0".encode() + data)
    target = Path(parent) / f"{safe_name(submission.id)}-{digest.hexdigest()[:16]}"
    if target.is_dir() and not target.is_symlink():
        return target
    Path(parent).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=parent))
    try:
        for rel, data in contents.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
            with contextlib.suppress(OSError):  # an original gone since: the copy keeps the time it was made
                os.utime(staging / rel, ns=(time.time_ns(), os.stat(origins[rel]).st_mtime_ns))
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():  # another check made it meanwhile, or the disk is at fault
            raise
    return target


MAX_REASON_CHARS = 400  # of a reason: a compiler's or a schema's line may quote the submission's own text


def one_line(text: str) -> str:
    """A reason as one printable line of at most MAX_REASON_CHARS: its control characters escaped, so a
    submission's own text quoted in it (a compiler's line, an #error) never reaches a terminal as such."""
    line = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in (text.splitlines() or [""])[0])
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS - 3] + "..."
