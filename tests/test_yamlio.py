import time
import tracemalloc

import pytest

from convsweep.base import yamlio
from convsweep.base.errors import ConfigError
from convsweep.base.yamlio import MAX_FILE_BYTES, MAX_NODES, load_yaml, read_yaml_file


def billion_laughs(kind: str = "list", levels: int = 9) -> str:
    """The classic alias bomb: nine levels of nine aliases to the level before, 9**9 values once expanded."""
    lines = ["experiments:", "  e1:", "    params:"]
    if kind == "list":
        lines.append('      a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]')
    else:
        lines.append("      a: &a {x: lol}")
    previous = "a"
    for level in range(1, levels):
        name = f"l{level}"
        refs = [f"*{previous}" if kind == "list" else f"k{i}: *{previous}" for i in range(9)]
        body = "[" + ", ".join(refs) + "]" if kind == "list" else "{" + ", ".join(refs) + "}"
        lines.append(f"      {name}: &{name} {body}")
        previous = name
    return "\n".join(lines) + "\n"


def refused_quickly(call):
    """The ConfigError `call` raises, checked to come in well under a second and 20 MB of Python memory. The time
    is this thread's CPU time: a wall clock counted a worker kept waiting by a loaded machine (0.91 s seen in CI,
    with 36 KB of memory: the alias bomb had been refused at once)."""
    tracemalloc.start()
    start = time.thread_time()
    try:
        with pytest.raises(ConfigError) as info:
            call()
    finally:
        elapsed = time.thread_time() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < 0.5 and peak < 20e6, (elapsed, peak)
    message = str(info.value)
    assert "\n" not in message and len(message) < 200
    return message


@pytest.mark.parametrize("kind", ["list", "mapping"])
def test_a_billion_laughs_is_refused_at_its_first_alias(tmp_path, kind):
    path = tmp_path / "experiments.yaml"
    path.write_text(billion_laughs(kind))
    message = refused_quickly(lambda: read_yaml_file(path))
    # The first collection of too many values is l5's (9**6 > 100,000): its first alias is on its line.
    assert message == f"{path}:9: YAML aliases from here expand to more than {MAX_NODES:,} values"


def test_merge_keys_count_what_they_merge():
    """Each level merges the one before twice (<<: [*a, *a] keeps one copy, but PyYAML's flattening
    copies both): the check counts what a merge brings in, not the alias alone."""
    lines, previous = ["l0: &l0 {x: 1, y: 2, z: 3, w: 4, v: 5, u: 6, t: 7, s: 8, r: 9}"], "l0"
    for level in range(1, 12):
        lines.append(f"l{level}: &l{level} {{<<: [*{previous}, *{previous}], k{level}: *{previous}}}")
        previous = f"l{level}"
    message = refused_quickly(lambda: load_yaml("\n".join(lines), "m.yaml"))
    assert message.startswith("m.yaml:") and "YAML aliases from here expand" in message


def test_a_small_anchor_used_twice_loads():
    text = "one: &best {naive: {BLOCK: 128}}\ntwo: *best\nthree: {<<: *best, fp16: {PR: 2}}\n"
    data = load_yaml(text, "x.yaml")
    assert data["two"] == data["one"] == {"naive": {"BLOCK": 128}}
    assert data["three"] == {"naive": {"BLOCK": 128}, "fp16": {"PR": 2}}


def test_a_duplicate_key_is_an_error_with_its_line():
    text = "experiments:\n  a: {batches: [1]}\n  b: {batches: [2]}\n  a: {batches: [3]}\n"
    with pytest.raises(ConfigError, match=r"^experiments.yaml:4: duplicate key 'a'$"):
        load_yaml(text, "experiments.yaml")
    with pytest.raises(ConfigError, match=r"^x.yaml:1: duplicate key 'k'$"):
        load_yaml("{k: 1, k: 2}", "x.yaml")


def test_a_key_a_merge_brought_may_be_given_again():
    assert load_yaml("base: &b {x: 1, y: 2}\nchild: {<<: *b, x: 3}\n", "x.yaml")["child"] == {"x": 3, "y": 2}


def test_an_alias_inside_its_own_anchor_is_refused():
    with pytest.raises(ConfigError, match=r"^r.yaml:1: an alias refers to its own anchor's contents$"):
        load_yaml("a: &a [1, *a]\n", "r.yaml")


def test_one_collection_of_too_many_values_is_refused(monkeypatch):
    monkeypatch.setattr(yamlio, "MAX_NODES", 1000)
    text = "streams: [1]\nbatches: [" + ",".join(["1"] * 1000) + "]\n"
    message = refused_quickly(lambda: load_yaml(text, "big.yaml"))
    assert message == "big.yaml:2: more than 1,000 values in one collection"


def test_a_file_too_large_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("batches: [" + "1, " * 3_250_000 + "1]\n")  # 6.5 M batches, 9.75 MB
    size = path.stat().st_size
    message = refused_quickly(lambda: read_yaml_file(path))
    assert message == f"{path}: {size:,} bytes; a convsweep YAML file holds at most {MAX_FILE_BYTES:,}"


def test_nesting_is_bounded():
    with pytest.raises(ConfigError, match=r"^d.yaml:1: nested more than 64 levels deep$"):
        load_yaml("[" * 100 + "]" * 100, "d.yaml")


def test_syntax_errors_keep_their_line():
    with pytest.raises(ConfigError, match=r"^s.yaml:\d+: not valid YAML \(did not find expected"):
        load_yaml("a: 1\nb: [\nc", "s.yaml")
    assert load_yaml("", "empty.yaml") is None


# -- line_of: where an error about the constructed document points (issue 54) ------------------------

LINES = """\
# a comment, so the first key is on line 2
base: &base
  network: n.yaml
  batches: [1, 2]
experiments:
  e1:
    <<: *base
    batches:
      - 10
      - 20
    checks: fst
    ratio: .nan
  e2: *base
  1: one
  true: yes
"""


@pytest.mark.parametrize("keys, line", [
    ([], 2),
    (["base", "network"], 3),
    (["experiments", "e1"], 6),
    (["experiments", "e1", "batches"], 8),  # its own key wins over the merged one
    (["experiments", "e1", "batches", 1], 10),
    (["experiments", "e1", "network"], 3),  # brought by the merge: where it is written
    (["experiments", "e1", "checks"], 11),
    (["experiments", "e2"], 13),
    (["experiments", "e2", "batches", 0], 4),  # through the alias, to the anchor's text
    (["experiments", 1], 14),
    (["experiments", True], 15),
])
def test_line_of_names_the_line_of_a_key_or_item(tmp_path, keys, line):
    path = tmp_path / "s.yaml"
    path.write_text(LINES)
    assert yamlio.line_of(path, keys) == line


@pytest.mark.parametrize("keys", [
    ["nope"], ["experiments", "e1", "batches", 2], ["experiments", "e1", "checks", "x"], ["experiments", "1"],
    ["experiments", 1.0], ["base", 0],
])
def test_line_of_is_none_where_the_file_has_nothing(tmp_path, keys):
    path = tmp_path / "s.yaml"
    path.write_text(LINES)
    assert yamlio.line_of(path, keys) is None


def test_line_of_names_a_line_only_where_the_file_says_the_same_scalar(tmp_path):
    """A checked document may be the file with --config overrides in it: a value the file does not hold
    has no line; a collection may have gained defaults, so its key alone counts."""
    path = tmp_path / "s.yaml"
    path.write_text(LINES)
    e1 = ["experiments", "e1"]
    assert yamlio.line_of(path, [*e1, "checks"], "fst") == 11
    assert yamlio.line_of(path, [*e1, "checks"], "fast") is None
    assert yamlio.line_of(path, [*e1, "batches", 0], 10) == 9
    assert yamlio.line_of(path, [*e1, "batches", 0], 10.0) is None
    assert yamlio.line_of(path, [*e1, "batches", 0], True) is None
    assert yamlio.line_of(path, [*e1, "ratio"], float("nan")) == 12
    assert yamlio.line_of(path, e1, {"checks": "fst", "repeats": "auto"}) == 6  # defaults filled in
    assert yamlio.line_of(path, e1, "e1") is None  # the file holds a mapping there


def test_line_of_is_none_for_a_file_it_cannot_read_now(tmp_path, monkeypatch):
    assert yamlio.line_of(tmp_path / "gone.yaml", []) is None
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1,\n")
    assert yamlio.line_of(broken, ["a"]) is None
    monkeypatch.setattr(yamlio, "MAX_NODES", 10)  # the loader's bounds hold here too
    big = tmp_path / "big.yaml"
    big.write_text("a: [" + ", ".join(["1"] * 20) + "]\n")
    assert yamlio.line_of(big, ["a"]) is None
    assert yamlio.line_of(tmp_path / "nothing.yaml", []) is None
    (tmp_path / "empty.yaml").write_text("")
    assert yamlio.line_of(tmp_path / "empty.yaml", []) is None
