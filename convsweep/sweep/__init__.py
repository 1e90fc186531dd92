"""The sweep wing: what an experiments file means. Experiments into jobs and cells (`config`), which settings a
job measures and in what order (`search`), the `sanitize: true` pass, a class's submission folders
(`submissions`) and a class in a sweep (`classes`: its submissions' variants as jobs, those left out and why).
May import: base, model, inputs."""
