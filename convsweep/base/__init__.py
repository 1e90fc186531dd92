"""The base wing: what every other wing may use and that imports nothing of convsweep above it. One exception
family, where the checkout's files are, atomic and checked file writes, sealed caches, bounded YAML and JSON
reading, numbers and statistics, the sweep's axes (declared once), schema validation, registry expressions,
progress bars, a document as blocks, and a job worker's heartbeat. May import: nothing of convsweep outside this wing."""
