"""The sweep's axes, declared once: what a cell of the matrix holds fixed besides its variants.

Everything that lists axes derives from `AXES`: the specs' fields (config.Cell), the expansion's
product and job ids (config), the experiments and result schemas (schema.py adds each axis's
property when it loads them), the `run` table's columns (store.models), the views' cell columns
(store.views, frozen by a migration) and the named queries' {cell} (query.expand_cell), compare's
idea of one cell and report's columns, and the figures' series. Adding an axis is one entry here,
the code that acts on its value, and a migration for its column and the views it regenerates.

This module is pure data: it imports nothing of convsweep, so any layer may read it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

REQUIRED: Any = object()  # an axis without a default: every spec names its value


@dataclass(frozen=True)
class Axis:
    """One axis of the sweep matrix.

    name: the spec's field, the result JSON's key, the `run` column.
    key: the experiments.yaml key, a list of values (the axis's length in the product).
    type: the value's Python type in a spec (None is allowed where the default is None).
    item_schema: JSON Schema of one value as experiments.yaml gives it.
    spec_schema: JSON Schema of the value as a spec (and so a result file) holds it.
    description: what the axis is, in both schemas.
    default: the spec's value where absent (REQUIRED: none). A spec leaves the key out at this value,
      so specs written before the axis existed keep their hashes, job ids and run keys.
    config_default: the experiments.yaml default list (None: the key is required).
    from_config: experiments.yaml value -> spec value (chunk_images: "auto" -> None).
    id_part: spec value -> its piece of the job id ("" leaves it out).
    heading: how tables and figures name the axis.
    numeric: whether tables align its values as numbers.
    shown_at_default: whether summary.md gives it a column where every run has its default value.
    applies: (value, cell, on_gpu) -> whether a cell of the product runs at all with this value (`cell`:
      axis -> value; `on_gpu`: its variants run on the GPU); the expansion leaves the others out.
    refuse: (value, experiment) -> the one line that refuses an experiments.yaml value together with
      the experiment's other keys (None: fine); the planner adds file and key.
    describe: spec value -> what a figure's series name gains from it ("" at the value every run had before
      the axis existed); None for an axis that sets no series apart (figures take the fastest over it,
      or draw along it).
    """

    name: str
    key: str
    type: type
    item_schema: dict
    spec_schema: dict
    description: str
    heading: str
    default: Any = REQUIRED
    config_default: list | None = None
    from_config: Callable[[Any], Any] = field(default=lambda value: value)
    id_part: Callable[[Any], str] = field(default=lambda value: "")
    numeric: bool = False
    shown_at_default: bool = True
    applies: Callable[[Any, dict, bool], bool] = field(default=lambda value, cell, on_gpu: True)
    refuse: Callable[[Any, dict], str | None] = field(default=lambda value, experiment: None)
    describe: Callable[[Any], str] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def nullable(self) -> bool:
        return self.default is None

    def config_schema(self) -> dict:
        """experiments.yaml's property: a non-empty list of distinct values."""
        schema = {"description": self.description, "type": "array", "minItems": 1, "maxItems": 64,
                  "uniqueItems": True, "items": self.item_schema}
        if self.config_default is not None:
            schema["default"] = list(self.config_default)
        return schema

    def result_schema(self) -> dict:
        """The result file's property, in a job's and a measurement's spec."""
        return {**self.spec_schema, "description": self.description + ("" if self.required else
                                                                        f"; absent: {self.default}")}


_POSITIVE = {"type": "integer", "minimum": 1}

# In the order job ids name them; tables and the expansion's product follow it too.
AXES: tuple[Axis, ...] = (
    Axis("batch", "batches", int, {**_POSITIVE, "maximum": 1_000_000},
         {**_POSITIVE, "maximum": 2_147_483_647},
         "images per pass; at most 1,000,000 (4 GB of fp32 input even at 28x28; the planner also refuses a "
         "batch whose input, outputs and weights cannot fit a GPU's memory)", "batch", id_part=lambda v: f"-b{v}", numeric=True),
    Axis("streams", "streams", int, {**_POSITIVE, "maximum": 64}, {**_POSITIVE, "maximum": 2_147_483_647},
         "CUDA streams the batch is pipelined over; at most 64 (each holds its own chunk buffers)",
         "streams", config_default=[1], id_part=lambda v: f"-s{v}", numeric=True),
    Axis("chunk_images", "chunk_images", int,
         {"oneOf": [{"const": "auto"}, {**_POSITIVE, "maximum": 1_000_000}]},
         {"type": ["integer", "null"], "minimum": 1, "maximum": 2_147_483_647},
         "images per pipeline chunk (each chunk: H2D, every layer, D2H, on the streams in turn); auto (a "
         "spec's null) = the whole batch for one stream, else 4 chunks per stream",
         "chunk (images)", default=None, config_default=["auto"],
         from_config=lambda v: None if v == "auto" else v, id_part=lambda v: f"-c{v}" if v else "", numeric=True,
         shown_at_default=False),
    Axis("host_memory", "host_memory", str, {"enum": ["pageable", "pinned", "registered"]},
         {"enum": ["pageable", "pinned", "registered"]},
         "the host memory the batch and the logits live in: pageable, pinned or registered",
         "host memory", config_default=["pageable"], id_part=lambda v: f"-{v}"),
    Axis("input_format", "input", str, {"enum": ["fp32", "fp16", "u8", "u8-source"]},
         {"enum": ["fp32", "fp16", "u8", "u8-source"]},
         "what the batch crosses the bus as (convsweep/inputs/formats.py): fp32 (the network's input), fp16, u8 (bytes "
         "on the 1/255 grid, lossy) or u8-source (the dataset's stored digits, upscaled on the GPU); the device "
         "makes the network's input from it as the pass's first step, and the reference sees exactly what was "
         "shipped",
         "input", default="fp32", config_default=["fp32"], id_part=lambda v: "" if v == "fp32" else f"-{v}",
         shown_at_default=False, describe=lambda v: "" if v == "fp32" else f"{v} input"),
    Axis("cache", "cache", str, {"enum": ["warm", "cold"]}, {"enum": ["warm", "cold"]},
         "L2 state the conv layers find: warm (whatever the previous pass left), or cold (a buffer of twice "
         "the L2 size is written over before each conv layer, outside its timing, as nvbench does); cold "
         "applies to GPU variants at one stream, other cells run warm only",
         "L2", default="warm", config_default=["warm"], id_part=lambda v: "-cold" if v == "cold" else "",
         # L2 is the GPU's, and a flush on one stream would hit the others' kernels
         applies=lambda v, cell, on_gpu: v == "warm" or (on_gpu and cell["streams"] == 1),
         describe=lambda v: "cold L2" if v == "cold" else ""),
    Axis("timer", "timer", str, {"enum": ["events", "graph"]}, {"enum": ["events", "graph"]},
         "how a timed pass is timed: events (CUDA events around the enqueued pass, and around each conv layer "
         "and copy; nsys's records where it profiles) or graph (the pass captured once as a CUDA graph, each "
         "timed pass one replay between two events: the whole pass only, with the host's launch calls out of "
         "it, as the bench times its end-to-end row); graph applies to GPU variants, a warm L2 and pinned or "
         "registered host memory, and is timed with events where the profiler is auto",
         "timer", default="events", config_default=["events"], id_part=lambda v: "-graph" if v == "graph" else "",
         shown_at_default=False,
         # a captured pass cannot write over L2 between its layers, nor copy from pageable memory
         applies=lambda v, cell, on_gpu: v == "events" or (on_gpu and cell["cache"] == "warm"
                                                            and cell["host_memory"] != "pageable"),
         refuse=lambda v, exp: None if v == "events" else
         "timer graph replays a captured pass, which nsys cannot split into layers: use profiler auto or events"
         if exp["profiler"] == "nsys" else
         "timer graph replays a captured pass, and a copy from pageable memory cannot be captured: add pinned "
         "or registered to host_memory" if set(exp["host_memory"]) == {"pageable"} else None,
         describe=lambda v: "graph replay" if v == "graph" else ""),
)

BY_NAME: dict[str, Axis] = {axis.name: axis for axis in AXES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# Keys a spec leaves out at their default value (so older specs keep their hashes).
OMITTED_AT_DEFAULT: dict[str, Any] = {axis.name: axis.default for axis in AXES if not axis.required}
# One cell of the sweep, as tables, compare and report tell cells apart: these columns of `run`.
CELL_COLUMNS: tuple[str, ...] = ("experiment", "variant", *NAMES)
# The axes whose values set a figure's series apart (a cold L2 run is not the warm one's point).
SERIES_AXES: tuple[Axis, ...] = tuple(axis for axis in AXES if axis.describe is not None)


def applies(cell: dict[str, Any], on_gpu: bool) -> bool:
    """Whether a cell of the product runs: every axis's value applies to it (Axis.applies)."""
    return all(axis.applies(cell[axis.name], cell, on_gpu) for axis in AXES)


def refusal(experiment: dict[str, Any]) -> tuple[str, str] | None:
    """(experiments.yaml key, why) of the first axis value the experiment's other keys rule out."""
    for axis in AXES:
        for value in experiment[axis.key]:
            if (why := axis.refuse(value, experiment)) is not None:
                return axis.key, why
    return None


def shown(runs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The axes a table of every run gives a column: each one shown at its default, and any other
    where some run has another value."""
    return tuple(axis.name for axis in AXES if axis.shown_at_default or axis.required
                 or any(run.get(axis.name, axis.default) != axis.default for run in runs))


def job_id_part(values: dict[str, Any]) -> str:
    """The axes' piece of a job id: '-b10000-s1-pinned' (parts at their default left out)."""
    return "".join(axis.id_part(values.get(axis.name, axis.default)) for axis in AXES)


def cell_text(values: dict[str, Any]) -> str:
    """A cell as a short label, the job id's pieces: 'b10000 s1 c100 pinned cold'."""
    return " ".join(part[1:] for axis in AXES if (part := axis.id_part(values.get(axis.name, axis.default))))


def spec_values(spec: dict[str, Any]) -> dict[str, Any]:
    """axis -> value of a spec dict as a result file holds it (an absent key is its default)."""
    return {axis.name: spec.get(axis.name, None if axis.required else axis.default) for axis in AXES}


def sort_key(values: dict[str, Any]) -> tuple:
    """Cells in the order tables list them: axis by axis, ascending, an automatic (None) value first."""
    return tuple((values[axis.name] is not None, values[axis.name]) for axis in AXES)


def _kept(leave_out: tuple[str, ...]) -> tuple[Axis, ...]:
    unknown = sorted(set(leave_out) - set(NAMES))
    if unknown:
        raise ValueError(f"no axis named {', '.join(unknown)} (the axes: {', '.join(NAMES)})")
    return tuple(axis for axis in AXES if axis.name not in leave_out)


def columns(alias: str = "", leave_out: tuple[str, ...] = ()) -> str:
    """The axes' columns of `run` for a SELECT list: 'r.batch, r.streams, ...' (unqualified without an
    alias), those in `leave_out` left out."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{axis.name}" for axis in _kept(leave_out))


def order_by(alias: str = "", leave_out: tuple[str, ...] = ()) -> str:
    """An ORDER BY list that sorts runs as sort_key does, on SQLite and PostgreSQL alike (whose NULLs
    sort last where SQLite's sort first); those in `leave_out` left out."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{axis.name} IS NOT NULL, {prefix}{axis.name}" if axis.nullable
                     else f"{prefix}{axis.name}" for axis in _kept(leave_out))


def series_suffix(row: dict[str, Any]) -> str:
    """What a figure's series name gains from the axes that set series apart: ', cold L2'."""
    return "".join(f", {part}" for axis in SERIES_AXES  # each with its describe
                   if axis.name in row and (part := cast(Callable[[Any], str], axis.describe)(row[axis.name])))


def series_values(row: dict[str, Any]) -> tuple:
    """The row's values of the axes that set series apart: a speedup compares series that share them."""
    return tuple(row.get(axis.name) for axis in SERIES_AXES)


def set_apart(row: dict[str, Any]) -> bool:
    """Whether an axis sets the row's series apart from its variant's plain one (a cold L2): figures draw
    it dashed or hatched beside it."""
    return bool(series_suffix(row))
