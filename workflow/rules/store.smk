# Every result of an experiment into the database, one transaction per file (ingest is idempotent).
# The command names the experiment's folders, not its files: one short line however many jobs. When a
# job failed this rule does not run; the Snakefile's onerror stores the results that were written.
# `store` names the database the record is made for (SweepPlan.store_id): a deleted or replaced one is
# another, and Snakemake, which reruns a job whose parameters changed, stores the results in it again.
rule ingest_results:
    input:
        lambda w: plan.run_files(w.experiment) + plan.profile_files(w.experiment) + plan.winners_files(w.experiment),
    output:
        f"{RESULTS}/{{experiment}}/ingested.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/ingest.log",
    params:
        db=plan.db_url,
        store=lambda w: plan.store_id,
        folders=lambda w: plan.result_folders(w.experiment),
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep ingest --db {params.db:q} --report {output:q} {params.folders:q} > {log:q} 2>&1"
