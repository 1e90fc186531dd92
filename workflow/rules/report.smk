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


# Which figures an experiment has data for is known only once its results are stored, so the folder
# is the output and `snakemake --report` takes every PNG in it. A kind without data is skipped (the
# log says why); none at all leaves the folder empty, never a failed rule.
rule draw_figures:
    input:
        rules.ingest_results.output,
    output:
        report(
            directory(f"{RESULTS}/{{experiment}}/figures"),
            patterns=["{name}.png"],
            category="{experiment}",
            subcategory="figures",
            labels={"figure": "{name}"},
        ),
    log:
        f"{RESULTS}/{{experiment}}/logs/figures.log",
    params:
        db=plan.db_url,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep report --experiment {wildcards.experiment} --db {params.db:q} --figures {output:q} --draw "
        "> {log} 2>&1"


# The seeds-format report: report.md links the figures; the HTML page embeds them, so it reads the same
# inside the Snakemake report (which shows HTML, and offers CSV files as downloads).
rule write_report:
    input:
        ingested=rules.ingest_results.output,
        figures=rules.draw_figures.output,
    output:
        markdown=f"{RESULTS}/{{experiment}}/report.md",
        page=report(
            f"{RESULTS}/{{experiment}}/report.html",
            category="{experiment}",
            subcategory="tables",
            labels={"table": "seeds-format report (report.md, figures embedded)"},
        ),
        seeds=report(
            f"{RESULTS}/{{experiment}}/tables/seeds.csv",
            category="{experiment}",
            subcategory="tables",
            labels={"table": "seeds' table with speedups (CSV)"},
        ),
        why=report(
            f"{RESULTS}/{{experiment}}/tables/why.csv",
            category="{experiment}",
            subcategory="tables",
            labels={"table": "why: Nsight Compute per conv kernel (CSV)"},
        ),
    log:
        f"{RESULTS}/{{experiment}}/logs/report-md.log",
    params:
        db=plan.db_url,
        tables=f"{RESULTS}/{{experiment}}/tables",
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep report --experiment {wildcards.experiment} --db {params.db:q} --figures {input.figures:q} "
        "--markdown {output.markdown:q} --html {output.page:q} --tables {params.tables:q} > {log} 2>&1"
