# Once every job of a cell (those that differ only in variant and tunables, one stream) has written its
# result, the fastest settings of each conv layer are measured again in one process, interleaved
# (convsweep.measure.confirm), and the file names each layer's winner and those tied with it. A cell whose jobs
# did not all finish waits for the next `snakemake`; without a GPU it writes nothing and fails, as run_job.
rule confirm_winners:
    input:
        lambda w: plan.winners_inputs(w.experiment, w.group),
    output:
        f"{RESULTS}/{{experiment}}/winners/{{group}}.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/{{group}}.log",
    params:
        spec=lambda w: plan.winners_spec_file(w.experiment, w.group),  # written by onstart
    resources:
        gpu=1,
        gpu_jobs=1,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep confirm-job --spec-file {params.spec:q} --out {output:q} > {log:q} 2>&1"
