"""The measure wing: measuring. How a pass is timed and its observers (`timing`), a network on the GPU and the
Backend seam (`runner`), the result file's typed records (`record`) and those of the files beside it (`files`:
bench, profile, confirm), what a job's settings share (`context`), the integrity checks and their verdicts
(`integrity`), measuring settings in this process (`settings`) and a cell's settings in turn (`interleaved`), one
job (`job`) and its deadlines (`deadline`), Nsight Compute profile jobs (`ncu`) and confirmation jobs (`confirm`).
May import: base, model, inputs, device, sweep."""
