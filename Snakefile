# convsweep: variant x batch x streams x host memory (x chunk size), one job each; a job measures
# the tunable settings of its cell in one process.
# Wiring only: the jobs, their specs, inputs and file names come from convsweep.plan.
import sys

from snakemake.utils import min_version, validate

sys.path.insert(0, workflow.basedir)  # plan with this checkout's convsweep, whatever is installed
from convsweep.plan import SweepPlan, release_scheduler_timer, skip_final_collection

min_version("8.0")


# `--configfile sweeps/x.yaml` runs that sweep alone; experiments.yaml is the default, not a base.
if not workflow.overwrite_configfiles:

    configfile: "experiments.yaml"


# convsweep's check first: it reports a bad key as one line (file: key.path: what was expected);
# Snakemake's validate then applies the same schema and defaults.
plan = SweepPlan(
    config, workflow.configfiles[-1] if workflow.configfiles else "experiments.yaml", checkout=workflow.basedir
)
validate(config, "workflow/schemas/experiments.schema.yaml")
RESULTS = plan.results_dir
# Every rule's `convsweep` is this checkout's (a shell function: see SweepPlan.shell_prefix).
shell.prefix(plan.shell_prefix(workflow.deployment_settings.deployment_method))


wildcard_constraints:
    experiment=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    job=r"[A-Za-z0-9][A-Za-z0-9_.+=-]*",


# A database that cannot take the results stops the sweep before any job runs.
onstart:
    plan.check_store()


# Snakemake's job-rate limiter would keep a finished run alive for up to a second more, and the
# interpreter's last garbage collection a third of a second.
onsuccess:
    release_scheduler_timer()
    skip_final_collection()


onerror:
    release_scheduler_timer()
    skip_final_collection()


include: "workflow/rules/infer.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/store.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        expand(f"{RESULTS}/{{experiment}}/summary.md", experiment=plan.experiments),
        expand(f"{RESULTS}/{{experiment}}/report.md", experiment=plan.experiments),
    default_target: True
