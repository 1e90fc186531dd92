# A kernel that does not compile is a result, not a stop: its error goes into the build file and
# the jobs using it are stored as failed with the compiler's line.
rule compile_variant:
    input:
        lambda w: plan.build_sources(w.build),
    output:
        f"{RESULTS}/builds/{{build}}.json",
    log:
        f"{RESULTS}/logs/compile/{{build}}.log",
    params:
        args=lambda w: plan.compile_args(w.build),
        entry=lambda w: plan.build_entry(w.build),  # the registry entry: editing it rebuilds
        arch=plan.arch,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep compile {params.args} --arch {params.arch} --record-errors --out {output} > {log} 2>&1"
