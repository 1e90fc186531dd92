# Experiments with `ncu: true` or `auto`: each GPU cell's conv kernels, every setting once, under Nsight
# Compute, in a job of its own (ncu replays kernels: it never touches a timed job). Where ncu may not
# read the GPU's counters, or is not installed under `ncu: auto`, the job writes a skipped file with the
# reason and the sweep goes on; without ncu under `ncu: true`, or without a GPU, it writes nothing and
# fails, as run_job does on a machine that cannot run it.
rule profile_kernels:
    input:
        lambda w: plan.job_sources(w.experiment, w.job),
    output:
        f"{RESULTS}/{{experiment}}/ncu/{{job}}.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/ncu-{{job}}.log",
    params:
        spec=lambda w: plan.spec_file(w.experiment, w.job),
        registry=lambda w: plan.registry_entries(w.experiment, w.job),
        ncu=lambda w: plan.ncu(w.experiment),  # true: ncu required; auto: a skipped profile without it
    resources:
        gpu=1,
        gpu_jobs=1,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep profile-job --spec-file {params.spec:q} --ncu {params.ncu:q} --out {output:q} > {log:q} 2>&1"
