"""scripts/forward_after_copy.py, the device diagnostic behind docs/performance.md's round six: what runs
without a GPU (its table, its refusal of a wrong name)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "forward_after_copy.py"


def _module():
    spec = importlib.util.spec_from_file_location("forward_after_copy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_unknown_variant_is_one_line_before_any_gpu_is_opened():
    done = subprocess.run([sys.executable, str(SCRIPT), "no_such_variant"], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown variant 'no_such_variant'" in lines[0], done.stderr


def test_the_table_gives_each_condition_against_the_first_back_to_back():
    fac = _module()
    row = [0.2, 0.21, 0.22, 0.19, 0.205, 0.2]
    text = fac.table(10000, "GPU X", {"v": row}, {"v": "ok"})
    header, rule, line = text.splitlines()[2:]
    assert header.split(" | ")[1:-1] == list(fac.CONDITIONS)
    assert rule.count("|") == len(fac.CONDITIONS) + 3
    assert line.startswith("| v | 0.2000 (+0.0%) | 0.2100 (+5.0%) | 0.2200 (+10.0%) | 0.1900 (-5.0%)")
    assert line.endswith("| ok |")
