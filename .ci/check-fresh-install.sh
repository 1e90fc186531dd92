#!/usr/bin/env bash
# README line 1 on a machine with only the NVIDIA driver: a fresh venv, `pip install -e .` with no
# extras, and NVRTC must come with it: every registered variant compiles for sm_90a, the H100's own target (no GPU needed).
# Then that venv's `snakemake --cores 1` runs a CPU sweep to its end: every rule of the default
# workflow (run, ingest, summary, figures, report) works without an extra, and so does
# `snakemake --report`.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q -e . 2>&1 | grep -v -e "is ignored: it is neither" -e "Running pip as" || true
out=$(CONVSWEEP_CACHE="$(dirname "$venv")/cache" "$venv/bin/convsweep" compile all --arch sm_90a --out "$(dirname "$venv")/all.json")
"$venv/bin/python" - "$(dirname "$venv")/all.json" <<'PY'
import json, sys
from convsweep.model.variants import load_registry

built = {b["variant"] for b in json.load(open(sys.argv[1]))["builds"]}
wanted = {name for name, var in load_registry().items() if not var.is_cpu}
missing = sorted(wanted - built)
if missing:
    sys.exit(f"fresh install: these variants did not compile for sm_90a: {', '.join(missing)}")
print(f"fresh install (pip install -e ., no extras): all {len(wanted)} GPU variants compiled for sm_90a with NVRTC "
      f"{__import__('convsweep.device.compile', fromlist=['nvrtc_version']).nvrtc_version()}")
PY

work="$(dirname "$venv")"
cat >"$work/cpu.yaml" <<'YAML'
experiments:
  fresh-install:
    variants: [reference]
    batches: [8]
    repeats: 2
    profiler: events
YAML
if ! CONVSWEEP_DB="sqlite:///$work/results.sqlite" CONVSWEEP_CACHE="$work/cache" PATH="$venv/bin:$PATH" \
    snakemake --cores 1 --configfile "$work/cpu.yaml" --config results_dir="$work/results" >"$work/sweep.log" 2>&1; then
  tail -30 "$work/sweep.log" >&2
  echo "fresh install: snakemake --cores 1 failed on a CPU sweep (log above)" >&2
  exit 1
fi
for made in summary.md report.md figures/op-time.png; do
  [ -s "$work/results/fresh-install/$made" ] || { echo "fresh install: the sweep wrote no $made" >&2; exit 1; }
done
# `snakemake --report` on the same plain install: Snakemake's report needs pygments, which only
# snakemake's `reports` extra brings (pyproject.toml asks for it).
if ! CONVSWEEP_DB="sqlite:///$work/results.sqlite" CONVSWEEP_CACHE="$work/cache" PATH="$venv/bin:$PATH" \
    snakemake --cores 1 --configfile "$work/cpu.yaml" --config results_dir="$work/results" \
    --report "$work/report.html" >"$work/report.log" 2>&1 || [ ! -s "$work/report.html" ]; then
  tail -30 "$work/report.log" >&2
  echo "fresh install: snakemake --report failed on the plain install (log above)" >&2
  exit 1
fi
echo "fresh install: snakemake --cores 1 ran a CPU sweep to its report with no extras, and snakemake --report wrote" \
  "$(du -k "$work/report.html" | cut -f1) KB of HTML"
