rule compile_variant:
    output:
        f"{RESULTS}/builds/{{build}}.json",
    log:
        f"{RESULTS}/logs/compile/{{build}}.log",
    params:
        args=lambda w: plan.compile_args(w.build),
        arch=plan.arch,
    conda:
        "../envs/convsweep.yaml"
    shell:
        "convsweep compile {params.args} --arch {params.arch} --out {output} > {log} 2>&1"
