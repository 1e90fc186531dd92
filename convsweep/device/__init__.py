"""The device wing: the GPU and the tools around it, with no notion of a sweep. NVRTC builds and what their PTX
does (`compile`, `findings`), the cuda.core runtime (`gpu`), the float64 truth computed on the GPU (`truth`),
the rounds of inputs no kernel has seen (`rounds`), Nsight Systems, provenance records, the GPU lock, and the
device's peak rates and the floors they give. May import: base, model, inputs."""
