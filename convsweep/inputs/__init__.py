"""The inputs wing: what a network is fed. Datasets, the formats a batch crosses the bus in, and a batch with its
weights and its reference logits (`batch`). May import: base, model."""
