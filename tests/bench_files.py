"""A small valid bench file for the bench tests, and a writer for edited copies of it."""
from pathlib import Path

GOOD = """
network: networks/lenet86.yaml
batch: 64
repeats: 3
warmup: 1
copy_mib: 1
candidates:
  conv1:
    - {variant: register_tiled_gemm, params: {BLOCK_M: 4, BLOCK_N: 256, BLOCK_K: 8, THREAD_M: 4, THREAD_N: 4}}
    - restrict_unroll
  conv2:
    - {variant: register_tiled_gemm}
    - {variant: fp16}
targets:
  batch: 64
  device: H100
  ms: {conv1: 0.6, conv2: {fp32: 0.8, fp16: 0.5}, forward: 1.0, end_to_end: 8.0, harness_events: 2000}
"""


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text(text)
    return path
