rule run_job:
    input:
        builds=lambda w: plan.build_files(w.experiment, w.job),
        sources=lambda w: plan.job_sources(w.experiment, w.job),
    output:
        f"{RESULTS}/{{experiment}}/runs/{{job}}.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/{{job}}.log",
    params:
        spec=lambda w: plan.spec_json(w.experiment, w.job),
    resources:
        gpu=1,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep run-job --spec {params.spec:q} --builds {input.builds:q} --out {output} > {log} 2>&1"
