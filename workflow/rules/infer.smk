# One job per cell of the matrix: it compiles its settings' kernels (in parallel, cached), measures
# each setting and writes one result file; a setting that fails is a result, not a stop. A job that
# cannot run on this machine (no GPU, no nsys, a full disk) writes nothing and fails: the next
# `snakemake` runs it again.
# Its log (stdout and stderr) holds why each setting is not ok, whole, and the compiler's whole message; its last
# line is the job's summary (`convsweep watch` shows it); the table at the end of the sweep points at it.
# Every placeholder is quoted (`:q`): the paths come from the config, and a shell never reads them as code.
rule run_job:
    input:
        lambda w: plan.job_sources(w.experiment, w.job),
    output:
        f"{RESULTS}/{{experiment}}/runs/{{job}}.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/{{job}}.log",
    params:
        spec=lambda w: plan.spec_file(w.experiment, w.job),  # written by onstart; the job id holds its hash
        registry=lambda w: plan.registry_entries(w.experiment, w.job),  # editing an entry re-measures
    # A job timed on the CPU takes every core, so it runs alone: others would slow its host timings.
    threads: lambda w: plan.threads(w.experiment, w.job, plan.local_cores(workflow))
    resources:
        gpu=lambda w: plan.gpus(w.experiment, w.job),  # 0 for a job on CPU variants only
        gpu_jobs=lambda w: plan.gpus(w.experiment, w.job),  # counted against the profile's gpu_jobs
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep run-job --spec-file {params.spec:q} --out {output:q} > {log:q} 2>&1"


# On a machine without a GPU the plan leaves the GPU jobs out (SweepPlan.left_out) and rule all asks for this
# file instead, removing it first: so every `snakemake` there runs a job and ends with the table of what was
# not run and status 1, where Snakemake would say "Nothing to be done" and exit 0.
rule note_jobs_left_out:
    output:
        plan.left_out_flag,
    log:
        f"{RESULTS}/not-run.log",
    localrule: True
    conda:
        "../envs/convsweep.yaml"
    shell:
        "touch {output:q} > {log:q} 2>&1"
