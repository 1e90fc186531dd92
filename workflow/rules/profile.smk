# Experiments with `ncu: true`: each GPU cell's conv kernels, every setting once, under Nsight
# Compute, in a job of its own (ncu replays kernels: it never touches a timed job). Without ncu the
# job writes a skipped file with the reason, and the sweep goes on.
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
    resources:
        gpu=1,
        gpu_jobs=1,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep profile-job --spec-file {params.spec:q} --out {output:q} > {log:q} 2>&1"
