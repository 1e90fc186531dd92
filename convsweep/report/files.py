"""The report written: report.md, one self-contained HTML page, the CSV tables and summary.md, each atomically."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from convsweep.base.document import Heading, Paragraph, to_html, to_markdown
from convsweep.base.fileio import checked_directory, write_atomic
from convsweep.figures import figure_files
from .coverage import read_coverage, section as coverage_section
from .runs import Experiment, NoRuns, _rows, load
from .sections import build
from .tables import SEEDS_CSV_COLUMNS, seeds_rows, summary_markdown, why_rows


@dataclass
class Written:
    """What `write` wrote, for the command to print."""

    paths: list[Path] = field(default_factory=list)


def write(url: str | None, experiment: str, markdown: Path | None = None, page: Path | None = None,
          tables: Path | None = None, figures_dir: Path | None = None, summary: Path | None = None,
          allow_empty: bool = False) -> Written:
    """Write the report of `experiment` as Markdown, as an HTML page, as CSV tables (seeds.csv,
    why.csv in `tables`) and as summary.md, each where asked, from one read of the database;
    figures are the PNGs in `figures_dir`. `allow_empty`: an experiment with no run stored gets a
    report saying so (the end of a sweep none of whose jobs finished) instead of an error. Written into the
    experiment's results folder, each lists what its sweep asked for and has no result of (coverage)."""
    folder = next((path.parent for path in (summary, markdown, page) if path and path.parent.name == experiment), None)
    try:
        data = load(url, experiment)
    except NoRuns:
        if not allow_empty:
            raise
        why_columns, _ = _rows(url, "why")  # seeds.csv and why.csv keep their headers
        data = Experiment(experiment, [], why_columns)
    data.coverage = read_coverage(folder, {run["job_id"] for run in data.runs})
    if data.coverage is not None:  # a stored run of a job whose last attempt left no result is from before it
        data.runs = [run for run in data.runs if run["job_id"] not in data.coverage.superseded]
    if not data.runs:
        nothing = [Heading(1, f"Report: {experiment}"),
                   Paragraph("No run of this experiment is stored yet." + ("" if data.coverage else " None of its jobs "
                             "has finished: the end of `snakemake` says why; `snakemake` again retries them.")),
                   *coverage_section(data.coverage, [], "")]
        return _write_blocks(data, nothing, markdown, page, tables, summary)
    return _write_blocks(data, build(data, figure_files(figures_dir), figures_dir), markdown, page, tables, summary)


def _write_blocks(data: Experiment, blocks: list, markdown: Path | None, page: Path | None, tables: Path | None,
                  summary: Path | None) -> Written:
    from convsweep.analysis.query import render

    done = Written()
    experiment = data.name
    directories = [path.parent for path in (summary, markdown, page) if path is not None]
    for directory in directories + ([tables] if tables is not None else []):
        checked_directory(directory)  # a link another user made is refused, before any file is written
    if summary is not None:
        write_atomic(summary, summary_markdown(data) if data.runs else to_markdown(blocks, summary.parent))
        done.paths.append(summary)
    if markdown is not None:
        write_atomic(markdown, to_markdown(blocks, markdown.parent))
        done.paths.append(markdown)
    if page is not None:
        write_atomic(page, to_html(blocks, f"Report: {experiment}"))
        done.paths.append(page)
    if tables is not None:
        write_atomic(tables / "seeds.csv", render(SEEDS_CSV_COLUMNS, seeds_rows(data), "csv"))
        write_atomic(tables / "why.csv", render(data.why_columns, why_rows(data), "csv"))
        done.paths += [tables / "seeds.csv", tables / "why.csv"]
    return done
