"""The app wing: what people and Snakemake call. The Snakefile's view of a sweep (`plan`), the command line
(`cli`, `cliargs`, one module per command in `commands/`), `convsweep watch`, Kernel Tuner's files and
Datasette. May import: every other wing."""
