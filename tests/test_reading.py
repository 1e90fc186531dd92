"""The reading vocabulary the report and the figures share, without a database or matplotlib: the
caption's where-and-when sentence and the bench file's ceilings."""
from __future__ import annotations

import pytest

from convsweep.base.errors import ConvsweepError
from convsweep.analysis.reading import load_ceilings, provenance


@pytest.mark.parametrize("text, why", [("{", "not JSON"), ('{"ceilings": {}}', "no ceilings.dtod_GBps")])
def test_a_bad_bench_file_is_one_line(tmp_path, text, why):
    path = tmp_path / "bench.json"
    path.write_text(text)
    with pytest.raises(ConvsweepError, match=why):
        load_ceilings(path)


def test_a_caption_names_the_cpu_for_cpu_runs_and_never_an_unnamed_gpu():
    rows = [{"gpu": None, "profiler": "cpu", "started_at": "2026-11-23T10:00:00+00:00", "git_commit": "abc1234567",
             "git_dirty": False},
            {"gpu": "NVIDIA H100 80GB HBM3", "profiler": "nsys", "started_at": "2026-11-23T11:00:00+00:00",
             "git_commit": "abc1234567", "git_dirty": False}]
    assert provenance(rows) == ("Measured on NVIDIA H100 80GB HBM3 and the CPU on 2026-11-23, at commit abc1234567.")


def test_a_caption_names_no_gpu_that_a_run_did_not_open():
    """A run that failed before it opened a GPU stores none: it is left out, and alone it says so."""
    failed = {"gpu": None, "profiler": None, "started_at": "2026-11-23T09:00:00+00:00", "git_commit": "abc1234567",
              "git_dirty": False}
    measured = {**failed, "gpu": "NVIDIA H100 80GB HBM3", "profiler": "events"}
    assert provenance([failed, measured]) == "Measured on NVIDIA H100 80GB HBM3 on 2026-11-23, at commit abc1234567."
    assert provenance([failed, {**failed, "git_dirty": True}]) == \
        "No run opened a GPU (runs on 2026-11-23, at commit abc1234567 (with uncommitted changes))."
