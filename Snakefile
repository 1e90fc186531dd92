# convsweep: variant x the sweep's axes (batch, streams ...: convsweep/base/axes.py), one job each; a job measures
# the tunable settings of its cell in one process.
# Wiring only: the jobs, their specs, inputs and file names come from convsweep.app.plan.
import sys

from snakemake.utils import min_version, validate

sys.path.insert(0, workflow.basedir)  # plan with this checkout's convsweep, whatever is installed
from convsweep.analysis.outcome import shorten_failures
from convsweep.app.plan import SweepPlan

min_version("8.0")


# `--configfile sweeps/x.yaml` runs that sweep alone; experiments.yaml is the default, not a base.
# A missing, empty or unreadable one is convsweep's one line, before Snakemake's loader (which YAML aliases can stall).
if not workflow.overwrite_configfiles:
    SweepPlan.check_configfile("experiments.yaml")

    configfile: "experiments.yaml"


# convsweep's check first: it stops at a bad key with one line (file: key.path: what was expected);
# Snakemake's validate then applies the same schema and defaults: workflow/schemas/experiments.schema.yaml
# with the axes of convsweep/base/axes.py added, written to a file.
# The plan reads `workflow` for where the jobs run: a machine without a GPU leaves the GPU jobs out, and says
# so before any job runs (SweepPlan.left_out).
plan = SweepPlan.for_snakefile(config, workflow.configfiles, checkout=workflow.basedir, workflow=workflow)
validate(config, plan.schema_file)
RESULTS = plan.results_dir
# Every rule's `convsweep` is this checkout's (a shell function: see SweepPlan.shell_prefix).
shell.prefix(plan.shell_prefix(workflow.deployment_settings.deployment_method))
# A job that fails is two lines of the terminal, its id and why, and its log (convsweep.analysis.outcome.BriefFailures).
shorten_failures(workflow)


wildcard_constraints:
    experiment=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    job=r"[A-Za-z0-9][A-Za-z0-9_.+=-]*",
    group=r"winners-[A-Za-z0-9_.+=-]+",


# A database that cannot take the results stops the sweep before any job runs; then each job's spec
# is written to the file its command names, and each experiment's record of the jobs left out.
onstart:
    plan.check_store()
    plan.write_specs()
    plan.write_not_run()


# Whatever happened, the terminal ends with what the sweep stored and what did not finish, and why
# (convsweep.analysis.outcome); the results of the jobs that finished are stored even when others failed.
# Only the experiments asked for: `snakemake results/E/summary.md` leaves the others' files alone.
# Jobs left out by the machine, or a sweep in which no setting finished ok, end it with status 1 after the table,
# as a failed job would (convsweep.analysis.outcome.finish_sweep); some settings ok and others failed is status 0.
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
# ingested (SweepPlan.targets says why). A function: where the jobs run is known once Snakemake runs it.
rule all:
    input:
        lambda w: plan.targets(),
    default_target: True
