"""The sweep wing: what an experiments file means. Experiments into jobs and cells (`config`), which settings a
job measures and in what order (`search`), the `sanitize: true` pass, and a class's submission folders
(`submissions`). May import: base, model, inputs."""
