"""The analysis wing: reading what was stored. The vocabulary the report and figures share (`reading`),
bounded read-only SQL (`query`), B against A (`compare`), history and its change points, Pareto fronts, the
named questions, search strategies replayed on stored grids, and what a sweep left behind (`outcome`). May
import: base, model, inputs, device, sweep, measure, store."""
