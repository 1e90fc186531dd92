rule make_report:
    input:
        rules.ingest_results.output,
    output:
        f"{RESULTS}/{{experiment}}/summary.md",
    log:
        f"{RESULTS}/{{experiment}}/logs/report.log",
    params:
        db=plan.db_url,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep report --experiment {wildcards.experiment} --db {params.db:q} --out {output} > {log} 2>&1"
