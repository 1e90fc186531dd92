"""The model wing: what is computed, on the CPU and as data. The float64 numpy reference, the layer-kind table,
the output checks (tolerances by precision class), the kernel registry and its launch plans, and networks as
data. May import: base."""
