"""Make a class for a GPU sitting of course mode (docs/course.md): honest submissions to rank in tiers, and bad
ones, each of which the sitting must list with its reason. Every submission is one folder, OUT_DIR/<id>/, holding a
variants.yaml in the shipped schema and its .cu/.cuh files, with one variant named as a student would name it
(convsweep prefixes the class-wide `<id>__`).

    python scripts/make_class.py OUT_DIR [--sweep FILE] [--batches 1000,10000] [--sanitize]

What the class holds, and what the sitting should give each (status per job; "ok" ranks on the leaderboard):

- Shipped kernels at other tunables (12): a kernels/*.cu copied unchanged (its includes are shipped headers by
  plain name) with its kernels/variants.yaml entry, one tunable's default moved to another of its `values`.
  Expected: ok, ranked in tiers. naive-b64/-b128/-b512 are one kernel at three blocks: ties, one tier or
  neighbours. tf32-w8 and fp16-pr1 are checked at their precision's tolerance and ranked on the same board.
- The red team (rt-*): tests/redteam/*.cu with their tests/redteam/variants.yaml entries, `../../kernels/X`
  includes rewritten to `X`, memo.cuh copied in where included. The class runs each on every conv layer, checks
  full (the caching test on); the verdicts are tests/test_redteam.py's:
    rt-compute-once, rt-partial, rt-approx -> incorrect (a timed pass's logits fail the float64 truth);
    rt-memo-layer, rt-memo-corner-blind    -> ok at naive's time: a class runs them on both conv layers, which
                                              share one module's slots, so the memo never serves (on conv1
                                              alone memo-layer is suspect, tests/redteam/sweep.yaml); at batch
                                              10000 `failed`: their "B <= 1024", which a job checks;
    rt-memo-third                          -> left out of the sweep, listed with its reason: its constraints
                                              fit conv2 alone (a class runs a variant on every conv layer); the
                                              check passes it (it fits a layer). On conv2 alone it is suspect;
    rt-memo-hash, rt-memo-batch, rt-memo-pointer (the workspace is poisoned before every pass), rt-dedup,
    rt-round0 (fresh rounds: nothing repeats)  -> ok, and no faster than naive: naive-b*'s tier or below
                                              (rt-round0's build findings name its module-scope write);
    rt-low-mantissa                        -> ok: fp16-class at its default 10 mantissa bits, within tolerance.
- bug-compile: naive.cu with an undefined identifier. `submissions check` refuses it with NVRTC's line. The
  plan does no NVRTC, so the sweep still plans it; each of its jobs stores `failed` with the same compiler line
  (listed below the leaderboard's ranked table, as are every `incorrect`, `suspect` and `timeout`).
- bug-hang: tests/redteam/hang.cu (one thread spins forever) -> `timeout` at the class's deadline_s, the next
  job has the GPU (its Nsight Compute job, `ncu: auto`, is held to ten times the deadline, then skipped).
- bug-oob: tests/redteam/out_of_bounds.cu (writes 256 bytes past y; every output right) -> ok without
  sanitizing, which is the point of showing it; with --sanitize (`sanitize: true`) -> incorrect,
  "compute-sanitizer memcheck: ...".
- bug-wrong-answer: naive.cu with the filter's last column skipped -> incorrect.
- bug-illegal-address: naive.cu whose first thread of each plane writes a terabyte past y -> `failed` with the
  driver's reason (CUDA_ERROR_ILLEGAL_ADDRESS); its process ends, and the next job has the GPU.
"""
from __future__ import annotations

import argparse
import copy
import functools
import re
import sys
from pathlib import Path

import yaml

from convsweep.base.paths import KERNELS_DIR, ROOT

REDTEAM = ROOT / "tests" / "redteam"
CLASS_SWEEP = ROOT / "sweeps" / "class.yaml"

# (id, shipped variant, the name a student gives it, tunable, its new default): each a value of that tunable's
# `values` that keeps every restriction and LeNet-86 constraint valid.
SHIPPED = [
    ("naive-b64", "naive", "naive", "BLOCK", 64),
    ("naive-b128", "naive", "naive", "BLOCK", 128),
    ("naive-b512", "naive", "naive", "BLOCK", 512),
    ("constw-b128", "constant_weights", "constw", "BLOCK", 128),
    ("unroll-b128", "restrict_unroll", "unrolled", "BLOCK", 128),
    ("unroll-b512", "restrict_unroll", "unrolled", "BLOCK", 512),
    ("tiled-w32", "tiled_shared", "tiled", "TILE_W", 32),
    ("gemm-k8", "register_tiled_gemm", "gemm", "BLOCK_K", 8),
    ("fused-b256", "fused_conv_relu_pool", "fused", "BLOCK", 256),
    ("tf32-w8", "tf32_sliding_window", "tf32", "WARPS", 8),
    ("fp16-pr1", "fp16_sliding_window", "fp16", "PR", 1),
    ("im2col-c2", "im2col_gemm", "im2col", "COARSEN", 2),
]
# Red-team entries run as bug-* below, not rt-*.
AS_BUGS = {"redteam_hang": "bug-hang", "redteam_out_of_bounds": "bug-oob"}
# naive.cu edited: (id, the line's old text, its new text, why)
NAIVE_EDITS = [
    ("bug-compile", "conv_t acc = bias[m];", "conv_t acc = bias_of[m];",
     "refused by `submissions check` with NVRTC's line; its jobs `failed`"),
    ("bug-wrong-answer", "for (int q = 0; q < K; ++q)", "for (int q = 0; q < K - 1; ++q)",
     "incorrect: the filter's last column is skipped"),
    ("bug-illegal-address", "y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w] = acc;",
     "y[image_offset(b, M, H_out, W_out) + (m * H_out + h) * W_out + w + (pixel == 0 ? (1LL << 40) : 0)] = acc;",
     "failed with the driver's reason (an illegal address: a terabyte past y); the next job has the GPU"),
]
EXPECTED_RT = {
    "redteam_compute_once": "incorrect", "redteam_partial": "incorrect", "redteam_approx": "incorrect",
    "redteam_memo_layer": "ok at naive's time: on both conv layers the two share one module's slots, and its memo "
                          "never serves (suspect on conv1 alone, tests/redteam/sweep.yaml); failed at batch 10000 "
                          "(B <= 1024)",
    "redteam_memo_corner_blind": "ok at naive's time (fp32 input: its corners are no blind spot, and on both layers "
                                 "its memo never serves); failed at batch 10000 (B <= 1024)",
    "redteam_memo_third": "left out of the sweep (its constraints fit conv2 alone); check: ok",
    "redteam_low_mantissa": "ok (fp16-class, 10 mantissa bits: within tolerance)",
    "redteam_hang": "timeout (deadline_s)", "redteam_out_of_bounds": "ok; incorrect with --sanitize",
}
INCLUDE = re.compile(r'^(\s*#\s*include\s*)"([^"]+)"', re.MULTILINE)


def registry(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def dump(data: dict) -> str:
    """YAML as the shipped files write it: keys in order, short lists on one line, expressions never wrapped."""
    return yaml.safe_dump(data, sort_keys=False, width=1000, default_flow_style=None)


def write_submission(out: Path, sid: str, name: str, entry: dict, files: dict[str, str], note: str) -> None:
    """OUT_DIR/<sid>/: its registry (one variant, `name`) and its files."""
    folder = out / sid
    folder.mkdir(parents=True)
    for rel, text in files.items():
        (folder / rel).write_text(text)
    head = f"# {sid}: made by scripts/make_class.py. Expected: {note}\n"
    (folder / "variants.yaml").write_text(head + dump({name: entry}))
    print(f"{sid}: {name} ({entry['source']}): expected {note}")


def shipped_files(source: Path) -> dict[str, str]:
    """A shipped .cu, unchanged: every quoted include must be a shipped header's plain name."""
    text = source.read_text()
    for _, name in INCLUDE.findall(text):
        if not (KERNELS_DIR / name).is_file() or "/" in name:
            raise SystemExit(f"make_class: {source}: includes {name!r}, not a shipped header by plain name")
    return {source.name: text}


def redteam_files(source: Path) -> dict[str, str]:
    """A red-team .cu and the red-team headers it includes (followed to the end), each `../../kernels/X` include
    rewritten to the plain name `X` (docs/course.md, "Includes")."""
    files: dict[str, str] = {}
    todo = [source.name]
    while todo:
        rel = todo.pop()
        if rel not in files:
            files[rel] = INCLUDE.sub(functools.partial(plain_include, where=REDTEAM / rel, todo=todo),
                                     (REDTEAM / rel).read_text())
    return files


def plain_include(m: re.Match, where: Path, todo: list[str]) -> str:
    """One quoted include of a red-team file as handed in: a shipped header by plain name, or a file of
    tests/redteam/ copied beside it (put on `todo`)."""
    name = m.group(2)
    if name.startswith("../../kernels/"):
        return f'{m.group(1)}"{name.removeprefix("../../kernels/")}"'
    if "/" in name or not (REDTEAM / name).is_file():
        raise SystemExit(f"make_class: {where}: includes {name!r}, which it cannot hand in")
    todo.append(name)
    return m.group(0)


def make_class(out: Path) -> list[str]:
    """Every submission written into `out`; their ids."""
    shipped, redteam = registry(KERNELS_DIR / "variants.yaml"), registry(REDTEAM / "variants.yaml")
    ids = []
    for sid, variant, name, tunable, value in SHIPPED:
        entry = copy.deepcopy(shipped[variant])
        param = entry["params"][tunable]
        if value not in param["values"] or value == param["default"]:
            raise SystemExit(f"make_class: {variant}.{tunable}: {value} is not another of its values {param['values']}")
        param["default"] = value
        write_submission(out, sid, name, entry, shipped_files(KERNELS_DIR / entry["source"]),
                         f"ok, ranked ({variant} at {tunable}={value})")
        ids.append(sid)
    for variant, entry in redteam.items():
        stem = variant.removeprefix("redteam_")
        sid = AS_BUGS.get(variant, "rt-" + stem.replace("_", "-"))
        name = "memo" if stem.startswith("memo_") else stem
        entry = dict(entry, description=entry["description"].removeprefix("RED TEAM: "))
        write_submission(out, sid, name, entry, redteam_files(REDTEAM / entry["source"]),
                         EXPECTED_RT.get(variant, "ok, no faster than naive (its cheat never serves)"))
        ids.append(sid)
    naive = shipped["naive"]
    for sid, old, new, note in NAIVE_EDITS:
        text = (KERNELS_DIR / "naive.cu").read_text()
        if text.count(old) != 1:
            raise SystemExit(f"make_class: kernels/naive.cu: expected one {old!r} to edit for {sid}")
        write_submission(out, sid, "naive", copy.deepcopy(naive), {"naive.cu": text.replace(old, new)}, note)
        ids.append(sid)
    return ids


def write_sweep(path: Path, out: Path, batches: list[int] | None, sanitize: bool) -> None:
    """sweeps/class.yaml's experiment, named `class`, over `out` (absolute), at `batches` (default: its own)."""
    experiment = dict(registry(CLASS_SWEEP)["experiments"]["class"], submissions=str(out.resolve()))
    if batches:
        experiment["batches"] = batches
    if sanitize:
        experiment["sanitize"] = True
    head = ("# The class scripts/make_class.py wrote (its top comment says what each submission should get).\n"
            f"#   convsweep submissions check {out.resolve()}\n#   snakemake --configfile {path.resolve()}\n"
            "#   convsweep leaderboard --experiment class\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + dump({"experiments": {"class": experiment}}))


def batch_list(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batches such as 1000,10000, got {text!r}") from None
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"expected positive batches, got {text!r}")
    return batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", metavar="OUT_DIR", type=Path, help="where the class goes: a new or empty folder")
    parser.add_argument("--sweep", type=Path, metavar="FILE", help="also write a sweep file over OUT_DIR")
    parser.add_argument("--batches", type=batch_list, help="the sweep's batches (default: sweeps/class.yaml's)")
    parser.add_argument("--sanitize", action="store_true", help="the sweep runs compute-sanitizer (finds bug-oob)")
    args = parser.parse_args(argv)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        print(f"make_class: {args.out}: exists and is not an empty folder; give a new one", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    ids = make_class(args.out)
    print(f"{len(ids)} submissions in {args.out}")
    if args.sweep:
        write_sweep(args.sweep, args.out, args.batches, args.sanitize)
        print(f"sweep file: {args.sweep}")
    print("then, in the checkout:")
    print(f"  convsweep submissions check {args.out.resolve()}")
    print(f"  snakemake --configfile {args.sweep.resolve() if args.sweep else 'FILE  # (write one with --sweep FILE)'}")
    print("  convsweep leaderboard --experiment class")
    return 0


if __name__ == "__main__":
    sys.exit(main())
