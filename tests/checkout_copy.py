"""A copy of this checkout in a temporary folder, for tests that edit kernels or run its Snakefile
as a user's own clone would (the tracked files and any new ones git does not ignore)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from convsweep.base.paths import ROOT


def copy_checkout(dest: Path) -> Path:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest
