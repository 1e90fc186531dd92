from convsweep.report.coverage import left_out_key


# An experiment's report, in one process (a Python start and a matplotlib import are most of what a
# report costs, so one rule writes all of it): summary.md, the figures, the seeds-format report.md
# and its HTML page with the figures embedded, and the tables as CSV.
# Which figures an experiment has data for is known only once its results are stored, so the folder
# is the output and `snakemake --report` takes every PNG in it. A kind without data is skipped (the
# log says why); none at all leaves the folder empty, never a failed rule. The HTML page reads the
# same inside the Snakemake report (which shows HTML, and offers CSV files as downloads).
# The report also lists what the sweep asked for and has no result of (convsweep.report.coverage): a new result
# makes it again through its input, and a change to the jobs this machine leaves out through `left_out`.
rule make_report:
    input:
        stored=rules.ingest_results.output,
        bench=[plan.bench] if plan.bench else [],
    output:
        summary=f"{RESULTS}/{{experiment}}/summary.md",
        figures=report(
            directory(f"{RESULTS}/{{experiment}}/figures"),
            patterns=["{name}.png"],
            category="{experiment}",
            subcategory="figures",
            labels={"figure": "{name}"},
        ),
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
        f"{RESULTS}/{{experiment}}/logs/report.log",
    params:
        db=plan.db_url,
        tables=f"{RESULTS}/{{experiment}}/tables",
        options=plan.report_options(),
        left_out=lambda w: left_out_key(plan, w.experiment),  # not in the command: a change reruns the rule
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep report --experiment {wildcards.experiment:q} --db {params.db:q} --out {output.summary:q} "
        "--figures {output.figures:q} --draw --markdown {output.markdown:q} --html {output.page:q} "
        "--tables {params.tables:q} {params.options:q} > {log:q} 2>&1"
