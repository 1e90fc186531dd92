# convsweep: variant x the sweep's axes (batch, streams ...: convsweep/axes.py), one job each; a job measures
# the tunable settings of its cell in one process.
# Wiring only: the jobs, their specs, inputs and file names come from convsweep.plan.
import sys

from snakemake.utils import min_version, validate

sys.path.insert(0, workflow.basedir)  # plan with this checkout's convsweep, whatever is installed
from convsweep.plan import SweepPlan

min_version("8.0")


# `--configfile sweeps/x.yaml` runs that sweep alone; experiments.yaml is the default, not a base.
if not workflow.overwrite_configfiles:
    SweepPlan.check_configfile("experiments.yaml")  # before Snakemake's loader, which YAML aliases can stall

    configfile: "experiments.yaml"


# convsweep's check first: it stops at a bad key with one line (file: key.path: what was expected);
# Snakemake's validate then applies the same schema and defaults: workflow/schemas/experiments.schema.yaml
# with the axes of convsweep/axes.py added, written to a file.
plan = SweepPlan.for_snakefile(config, workflow.configfiles, checkout=workflow.basedir)
validate(config, plan.schema_file)
RESULTS = plan.results_dir
# Every rule's `convsweep` is this checkout's (a shell function: see SweepPlan.shell_prefix).
shell.prefix(plan.shell_prefix(workflow.deployment_settings.deployment_method))


wildcard_constraints:
    experiment=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    job=r"[A-Za-z0-9][A-Za-z0-9_.+=-]*",
    group=r"winners-[A-Za-z0-9_.+=-]+",


# A database that cannot take the results stops the sweep before any job runs; then each job's spec
# is written to the file its command names.
onstart:
    plan.check_store()
    plan.write_specs()


# Whatever happened, the terminal ends with what the sweep stored and what did not finish, and why
# (convsweep.outcome); the results of the jobs that finished are stored even when others failed.
# Only the experiments asked for: `snakemake results/E/summary.md` leaves the others' files alone.
onsuccess:
    plan.finish(workflow.dag_settings.targets)


onerror:
    plan.finish(workflow.dag_settings.targets)


include: "workflow/rules/infer.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/confirm.smk"
include: "workflow/rules/store.smk"
include: "workflow/rules/report.smk"


# Each experiment's ingest record, summary and report, and any result file missing since it was
# ingested (SweepPlan.targets says why).
rule all:
    input:
        plan.targets(),
    default_target: True
