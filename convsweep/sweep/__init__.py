"""The sweep wing: what an experiments file means. Experiments into jobs and cells (`config`), which settings a
job measures and in what order (`search`), and the `sanitize: true` pass. May import: base, model, inputs."""
