# One job per cell of the matrix: it compiles its settings' kernels (in parallel, cached), measures
# each setting and writes one result file; a setting that fails is a result, not a stop.
rule run_job:
    input:
        lambda w: plan.job_sources(w.experiment, w.job),
    output:
        f"{RESULTS}/{{experiment}}/runs/{{job}}.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/{{job}}.log",
    params:
        spec=lambda w: plan.spec_json(w.experiment, w.job),
        registry=lambda w: plan.registry_entries(w.experiment, w.job),  # editing an entry re-measures
    resources:
        gpu=lambda w: plan.gpus(w.experiment, w.job),  # 0 for a job on CPU variants only
        gpu_jobs=lambda w: plan.gpus(w.experiment, w.job),  # counted against the profile's gpu_jobs
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep run-job --spec {params.spec:q} --out {output} > {log} 2>&1"
