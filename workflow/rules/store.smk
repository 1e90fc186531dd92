rule ingest_results:
    input:
        lambda w: plan.run_files(w.experiment) + plan.profile_files(w.experiment),
    output:
        f"{RESULTS}/{{experiment}}/ingested.json",
    log:
        f"{RESULTS}/{{experiment}}/logs/ingest.log",
    params:
        db=plan.db_url,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep ingest --db {params.db:q} --report {output} {input:q} > {log} 2>&1"
