"""Course mode's submissions (docs/course.md): `convsweep submissions check` gives every submission one line, ok or
the reason, builds the honest ones with NVRTC (no GPU), and its path rules hold against includes that try to
leave the folder."""
from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest

from convsweep.base.errors import ConfigError
from convsweep.base.paths import KERNELS_DIR, ROOT
from convsweep.model.network import load_network
from convsweep.sweep import submissions as subs
from convsweep.sweep.submissions import scan_includes

NAIVE = (KERNELS_DIR / "naive.cu").read_text()
ENTRY = """\
{name}:
  source: {source}
  precision: fp32
  description: the naive kernel, handed in
  params:
    BLOCK: {{default: 256, values: [128, 256]}}
  constraints: ["M <= 65535"]
  launches:
    - kernel: {kernel}
      grid: ["{grid}", M, 1]
      block: [BLOCK, 1, 1]
"""
GRID = "B * ceil(H_out * W_out / BLOCK)"


def entry(name="mine", source="mine.cu", kernel="conv_forward", grid=GRID) -> str:
    return ENTRY.format(name=name, source=source, kernel=kernel, grid=grid)


def submission(parent: Path, sid: str, files: dict[str, str | bytes] | None = None, registry: str | None = None) -> Path:
    """submissions/<sid>/: the naive kernel renamed (mine.cu, variant mine) unless `files` say otherwise."""
    folder = parent / sid
    folder.mkdir(parents=True)
    for rel, text in {"mine.cu": NAIVE, **(files or {})}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    (folder / "variants.yaml").write_text(entry() if registry is None else registry)
    return folder


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))


def check(folder: Path, capsys, *options: str) -> tuple[int, str]:
    """`convsweep submissions check folder`: its exit status and output."""
    from convsweep.app.commands import submissions

    parser = argparse.ArgumentParser()
    submissions.add_parser(parser.add_subparsers())
    args = parser.parse_args(["submissions", "check", str(folder), *options])
    try:
        args.func(args)
        status = 0
    except SystemExit as e:
        status = int(e.code or 0)
    return status, capsys.readouterr().out


def lines_of(out: str) -> dict[str, str]:
    """Each submission's line, by id; every id has exactly one."""
    found: dict[str, list[str]] = {}
    for line in out.splitlines()[:-1]:
        found.setdefault(line.split(": ", 1)[0], []).append(line.split(": ", 1)[1])
    assert all(len(lines) == 1 for lines in found.values()), found
    return {sid: lines[0] for sid, lines in found.items()}


def test_a_class_gets_one_line_a_submission_and_the_honest_ones_pass(tmp_path, capsys):
    class_dir = tmp_path / "submissions"
    submission(class_dir, "jdoe2")
    nested = NAIVE.replace('#include "common.cuh"', '#include "lib/util.cuh"')
    submission(class_dir, "team-7", {"mine.cu": nested, "lib/util.cuh": '#pragma once\n#include "common.cuh"\n',
                                     "NOTES.md": "why it is fast\n"})
    submission(class_dir, "schema", registry=entry().replace("precision: fp32", "precision: fp64"))
    submission(class_dir, "expr", registry=entry(grid="B * ceil(H_out * W_out / BLOKC)"))
    submission(class_dir, "outside", registry=entry(source="../x.cu"))
    submission(class_dir, "passwd", {"mine.cu": '#include "../../etc/passwd"\n' + NAIVE})
    submission(class_dir, "absolute", {"mine.cu": '#include "/etc/passwd"\n' + NAIVE})
    os.symlink("/etc/passwd", submission(class_dir, "linked") / "evil.cuh")
    submission(class_dir, "broken", {"mine.cu": NAIVE.replace("acc = bias[m];", "acc = bias[m] + nope;")})
    submission(class_dir, "host", {"run.sh": "#!/bin/sh\nrm -rf ~\n"})
    submission(class_dir, "kernel", registry=entry(kernel="conv_forwrd"))
    status, out = check(class_dir, capsys)
    assert status == 1
    lines = lines_of(out)
    assert lines.keys() == {"jdoe2", "team-7", "schema", "expr", "outside", "passwd", "absolute", "linked", "broken",
                            "host", "kernel"}
    assert lines["jdoe2"] == "ok: 1 variant (jdoe2__mine), 1 build for sm_90a"
    assert lines["team-7"] == "ok: 1 variant (team_7__mine), 1 build for sm_90a"
    shown = str(class_dir)
    assert lines["schema"].startswith(f"{shown}/schema/variants.yaml:3: mine.precision: expected one of")
    assert lines["expr"] == (f"{shown}/expr/variants.yaml: mine.launches[0]: unknown name 'BLOKC' in "
                             "'B * ceil(H_out * W_out / BLOKC)'")
    assert lines["outside"].startswith(f"{shown}/outside/variants.yaml:2: mine.source: expected")
    assert lines["passwd"] == (f"{shown}/passwd/mine.cu:1: #include \"../../etc/passwd\": leaves the submission's "
                               "folder ('..')")
    assert lines["absolute"].startswith(f"{shown}/absolute/mine.cu:1: #include \"/etc/passwd\": an absolute path")
    assert lines["linked"] == f"{shown}/linked/evil.cuh: a link (to /etc/passwd): a submission holds plain files only"
    # the compiler's own line, about the submission's file (not the build folder it was copied to)
    assert re.fullmatch(rf"{re.escape(shown)}/broken/mine\.cu:\d+: identifier \"nope\" is undefined "
                        r"\(variant 'broken__mine', NVRTC\)", lines["broken"]), lines["broken"]
    assert lines["host"].startswith(f"{shown}/host/run.sh: not device code")
    assert lines["kernel"].startswith(f"{shown}/kernel/mine.cu: defines no extern \"C\" __global__ function "
                                      "'conv_forwrd'")
    assert out.splitlines()[-1] == "11 submissions: 2 ok, 9 not"


def test_all_ok_is_status_0_and_one_folder_is_checked_alone(tmp_path, capsys):
    one = submission(tmp_path / "submissions", "jdoe2")
    assert check(tmp_path / "submissions", capsys) == (0, "jdoe2: ok: 1 variant (jdoe2__mine), 1 build for sm_90a\n"
                                                          "1 submission: 1 ok, 0 not\n")
    status, out = check(one, capsys, "--format", "json")
    assert status == 0
    assert json.loads(out)["submissions"] == [{"id": "jdoe2", "ok": True, "reason": None, "variants": ["jdoe2__mine"],
                                              "builds": 1}]


def test_ids_and_class_wide_names(tmp_path, capsys):
    class_dir = tmp_path / "submissions"
    for sid in ("a-b", "A_b", "x__y", "-x", "x.", "2jdoe", "a" * 33):
        (class_dir / sid).mkdir(parents=True)
    (class_dir / ".git").mkdir()  # passed over, as a roster file beside the folders
    (class_dir / "roster.csv").write_text("jdoe2\n")
    os.symlink(tmp_path, class_dir / "linked")
    found = {item.id: item.refusal for item in subs.find_submissions(class_dir)}
    assert found.keys() == {"a-b", "A_b", "x__y", "-x", "x.", "2jdoe", "a" * 33, "linked"}
    assert "would be those of 'A_b' too" in found["a-b"] and "would be those of 'a-b' too" in found["A_b"]
    assert all("not a submission id" in found[sid] for sid in ("x__y", "-x", "x.", "2jdoe", "a" * 33))
    assert "a link, not a folder" in found["linked"]
    assert subs.class_name("team-7.b", "tiled") == "team_7_b__tiled"


def test_an_id_that_is_a_shipped_variant_s_name_is_refused(tmp_path, capsys):
    """The leaderboard takes a variant without `__` as its own submission: a student named `naive` (or `Naive`)
    would stand together with the shipped baseline, the better of the two runs taken for both."""
    class_dir = tmp_path / "submissions"
    submission(class_dir, "Naive")
    submission(class_dir, "naive2")
    status, out = check(class_dir, capsys)
    assert status == 1
    assert "the submission id 'Naive' is the name of a variant convsweep has" in lines_of(out)["Naive"]
    assert lines_of(out)["naive2"].startswith("ok")


def test_a_checked_submission_is_built_from_the_bytes_that_were_checked(tmp_path):
    folder = submission(tmp_path, "jdoe2", {"mine.cu": NAIVE.replace('"common.cuh"', '"lib/util.cuh"'),
                                            "lib/util.cuh": '#include "common.cuh"\n', "unused.cuh": "junk\n"})
    network = load_network(ROOT / "networks" / "lenet86.yaml")
    checked = subs.read_submission(folder, "jdoe2", "submissions/jdoe2", network)
    assert checked.reads == {"mine": ("mine.cu", "lib/util.cuh")}
    (folder / "lib" / "util.cuh").write_text('#include "../../../etc/passwd"\n')  # changed after the check
    built = subs.build_folder(checked, tmp_path / "builds")
    assert (built / "lib" / "util.cuh").read_text() == '#include "common.cuh"\n'
    assert (built / "common.cuh").read_bytes() == (KERNELS_DIR / "common.cuh").read_bytes()
    assert not (built / "unused.cuh").exists()
    assert subs.build_folder(checked, tmp_path / "builds") == built  # named by its contents: made once


@pytest.mark.parametrize("files, expected", [
    ({"common.cuh": "// mine\n"}, "common.cuh: takes the name of the shipped kernels/common.cuh"),
    ({"Common.cuh": "// mine\n"}, "Common.cuh: takes the name of the shipped kernels/common.cuh"),
    ({".hidden.cu": ""}, ".hidden.cu: expected a name of letters, digits"),
    ({"lib/tool.py": "import os\n", "a.so": b"\x7fELF"}, "a.so (and 1 more): not device code"),
    ({"mine.cu": '#include "lib/a.cuh"\n', "lib/a.cuh": '#include "b/c.cuh"\n', "lib/b/c.cuh": '#include "../../../x"\n'},
     "lib/b/c.cuh:1: #include \"../../../x\": leaves"),  # through nested headers
    ({"mine.cu": '#include "cuda_fp16.h"\n'}, "mine.cu:1: #include \"cuda_fp16.h\": no such file in the submission"),
    ({"mine.cu": '#include "nope.cuh"\n'}, "mine.cu:1: #include \"nope.cuh\": no such file"),
    ({"mine.cu": '#include "naive.cu"\n'}, "no such file in the submission, nor a shipped header"),  # a kernel, not a header
])
def test_a_submission_is_refused_in_one_line_naming_the_file(tmp_path, files, expected):
    folder = submission(tmp_path, "jdoe2", files)
    with pytest.raises(ConfigError) as info:
        subs.read_submission(folder, "jdoe2", "s/jdoe2", load_network(ROOT / "networks" / "lenet86.yaml"))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("s/jdoe2/") and expected in str(info.value), str(info.value)


def test_links_and_special_files_are_refused_wherever_they_lead(tmp_path):
    network = load_network(ROOT / "networks" / "lenet86.yaml")
    inward = submission(tmp_path, "inward", {"lib/a.cuh": ""})
    os.symlink("lib/a.cuh", inward / "b.cuh")  # a link that stays in the folder today may be pointed out of it later
    folder = submission(tmp_path, "folder")
    os.symlink("/etc", folder / "lib")
    fifo = submission(tmp_path, "fifo")
    os.mkfifo(fifo / "pipe.cuh")
    for path, expected in ((inward, "inward/b.cuh: a link (to lib/a.cuh)"), (folder, "folder/lib: a link (to /etc)"),
                           (fifo, "fifo/pipe.cuh: not a plain file")):
        with pytest.raises(ConfigError, match="^" + re.escape(f"s/{expected}")):
            subs.read_submission(path, path.name, f"s/{path.name}", network)


@pytest.mark.parametrize("registry, expected", [
    ("mine: {cpu: true, precision: fp32}", "mine.cpu: expected a GPU variant"),
    (entry(name="x" * 60), "its class-wide name jdoe2__" + "x" * 60 + " is 67 characters; at most 64"),
    (entry().replace('constraints: ["M <= 65535"]', 'constraints: ["M > 100"]'), "fits no conv layer of networks/lenet86"),
    (entry().replace('constraints: ["M <= 65535"]', 'restrictions: ["BLOCK / 0 > 1"]'), "division by zero"),
])
def test_a_registry_is_read_strictly(tmp_path, registry, expected):
    folder = submission(tmp_path, "jdoe2", registry=registry)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        subs.read_submission(folder, "jdoe2", "s/jdoe2", load_network(ROOT / "networks" / "lenet86.yaml"))


# -- the include scanner against what tries to get past it ------------------------------------------------------

def names(text: str | bytes) -> list[str]:
    return [include.name for include in scan_includes(text if isinstance(text, bytes) else text.encode(), "f.cu")]


@pytest.mark.parametrize("text, found", [
    ('#include "a.cuh"\n#include <cuda_fp16.h>\n', ["a.cuh", "cuda_fp16.h"]),
    (' \t#  \t include\t"../x"\n', ["../x"]),  # spaces and tabs around the '#'
    ('#/* c */include/* d */"../x"\n', ["../x"]),
    ('#/* a comment\n across lines */ include "../x"\n', ["../x"]),  # the directive goes on past the comment
    ('int a; /* x\n */ #include "../x"\n', ["../x"]),  # NVRTC: a directive
    ('#inc\\\nlude "../\\\nx"\n', ["../x"]),  # lines joined first, in the name too
    ('%:include "../x"\n', ["../x"]),  # the digraph of '#'
    ('#if 0\n"a"R"x(\n#endif\n#include "../x"\n)x"\n#endif\n', ["../x"]),  # "a"R is a suffix: no raw string
    ('int a = 1\'000; // */\n#include "../x"\n', ["../x"]),  # a digit separator starts no character literal
    ('const char *s = R"x(/*)x";\n#include "../x"\n', ["../x"]),  # a raw string's /* is no comment
    ('const char *s = "/*";\n#include "../x"\n// */\n', ["../x"]),
    ('#define X #include "../x"\n', ["../x"]),  # not a directive; checked all the same
    ('#if 0\n#include "../x"\n#endif\n', ["../x"]),
    ('\xef\xbb\xbf#include "../x"\n'.encode("latin-1"), ["../x"]),  # a byte-order mark
    ('#if __has_include(<cuda_fp16.h>)\n#endif\n', ["cuda_fp16.h"]),
    # what the compiler does not read as an include either
    ('// a comment \\\n#include "../x"\n', []),
    ('const char *s = R"x(\n#include "../x"\n)x";\n', []),
    ('/* #include "../x" */\n', []),
    ('#error don\'t\n#include "a.cuh"\n', ["a.cuh"]),  # an apostrophe ends with its line
])
def test_the_scanner_finds_every_include_the_compiler_would(text, found):
    assert names(text) == found


@pytest.mark.parametrize("text, expected", [
    ('#define H "../x"\n#include H\n', "f.cu:2: #include of a macro"),
    ('#include_next "x.h"\n', "f.cu:1: #include_next: a submission includes files with #include alone"),
    ('#import "x.h"\n', "f.cu:1: #import"),
    ('#embed "x.bin"\n', "f.cu:1: #embed"),
    ('#if 1\n#todo\n#endif\n', "f.cu:2: #todo: not a directive a submission may use"),
    ('#\\u0069nclude "../x"\n', "f.cu:1: #\\\\: not a directive"),
    ('??=include "../x"\n', "f.cu:1: a trigraph"),
    ('// c ??/\n#include "../x"\n', "f.cu:1: a trigraph"),
    ('// c \\ \n#include "../x"\n', "f.cu:1: a '\\' followed by spaces"),
    ('// c \r#include "../x"\n', "f.cu:1: a carriage return that ends no line"),
    ('int a;\n\0#include "../x"\n', "f.cu:2: a NUL byte"),
    ('#if defined(__has_include)\n#endif\n', "f.cu:1: __has_include without its (file)"),
    ('#if __has_include(H)\n#endif\n', "f.cu:1: __has_include of a macro"),
    ('#include "../x\n', "f.cu:1: #include: the file's name never ends"),
    ('/* never\n', "f.cu:1: a /* comment that never ends"),
    ('const char *s = R"x(\n', "f.cu:1: a raw string literal that never ends"),
    ('const char *s = R"x(a\\\nb)x";\n', "f.cu:1: a raw string literal holding a '\\' at a line's end"),
    ('import "../x";\n', "f.cu:1: a C++20 header import"),
])
def test_what_the_scanner_cannot_read_as_nvrtc_would_is_refused(text, expected):
    with pytest.raises(ConfigError, match="^" + re.escape(expected)):
        names(text)


@pytest.mark.parametrize("include, expected", [
    ('"../x.cuh"', "leaves the submission's folder"),
    ('"lib/../../x.cuh"', "leaves the submission's folder"),
    ("<../../../../tmp/x.h>", "leaves the submission's folder"),  # <> searches CUDA's folders: '..' climbs out of them
    ('"/etc/passwd"', "an absolute path"),
    ("</etc/passwd>", "an absolute path"),
    ('"lib\\x.cuh"', "expected a relative path of letters, digits"),
    ('"a b.cuh"', "expected a relative path of letters, digits"),
    ('"lib//x.cuh"', "expected a relative path"),
])
def test_an_include_name_that_leaves_the_folder_is_refused(tmp_path, include, expected):
    folder = submission(tmp_path, "jdoe2", {"mine.cu": f"#include {include}\n" + NAIVE})
    with pytest.raises(ConfigError) as info:
        subs.include_closure(folder, "mine.cu", frozenset(["mine.cu"]), "s/jdoe2", {})
    shown = include.replace("\\", "\\\\")  # a name is shown as Python's ascii() writes it
    assert str(info.value).startswith(f"s/jdoe2/mine.cu:1: #include {shown}: {expected}"), str(info.value)


def test_includes_resolve_as_nvrtc_resolves_them(tmp_path):
    """"x" beside the including file first, then at the submission's top; <x> at the top only; shipped headers and
    CUDA's by name, followed no further."""
    files = {"mine.cu": '#include "lib/a.cuh"\n#include <common.cuh>\n#include <cuda/barrier>\n',
             "lib/a.cuh": '#include "b.cuh"\n#include "c.cuh"\n#include "implicit_gemm.cuh"\n',
             "lib/b.cuh": "", "c.cuh": '#include <lib/d.cuh>\n', "lib/d.cuh": "", "b.cuh": "#error never read\n"}
    folder = submission(tmp_path, "jdoe2", files)
    texts: dict[str, bytes] = {}
    reads = subs.include_closure(folder, "mine.cu", frozenset(files), "s/jdoe2", texts)
    assert reads == ("mine.cu", "lib/a.cuh", "lib/b.cuh", "c.cuh", "lib/d.cuh")
    assert texts.keys() == set(reads)


# Pieces of C++ that move where a preprocessor thinks a line, a comment or a literal begins, around includes of a
# file outside the folder.
PIECES = ("#", "%:", "include", " ", "\t", "\n", "\\\n", "/*", "*/", "//", '"', "'", 'R"x(', ')x"', "u8", "R", "1'0",
          '"../evil.h"', "<../evil.h>", '#include "../evil.h"\n', "#if 0\n", "#endif\n", "#define M ", "__has_include",
          "(", ")", "_x", "$", "\f", '"a"', ";")


def test_nvrtc_follows_no_include_the_scanner_lets_by(tmp_path):
    """Differential: random sources of PIECES that the scanner passes with no name leaving the folder, compiled
    by NVRTC (no GPU) beside a file outside it whose inclusion is an #error: none includes it."""
    import random

    from convsweep.base.errors import CompileError
    from convsweep.device.compile import compile_ptx

    (tmp_path / "evil.h").write_text("#error EVIL REACHED\n")
    source = tmp_path / "sub" / "f.cu"
    source.parent.mkdir()
    pick, compiled = random.Random(55), 0
    for _ in range(400):
        text = "".join(pick.choice(PIECES) for _ in range(pick.randint(3, 20))) + '\nextern "C" __global__ void k() {}\n'
        try:
            found = scan_includes(text.encode(), "f.cu")
        except ConfigError:
            continue
        if any(".." in include.name for include in found):
            continue
        source.write_text(text)
        try:
            compile_ptx(source, "fuzz", {}, "sm_90a")
        except CompileError as e:
            assert "EVIL" not in e.log, repr(text)
        compiled += 1
    assert compiled > 100  # the scanner let enough by for the check to mean something
