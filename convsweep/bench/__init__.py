"""`convsweep bench`: our best variants beside cuDNN, the memory floor and the targets, in one process.

What it measures, in this order, on one GPU and in one process (every phase ends synchronized):

1. ceilings: a device-to-device copy (bytes read + written per second: the rate every memory
   floor is divided by) and a pinned host-to-device copy (the end-to-end floor's rate);
2. every conv candidate of `bench/default.yaml`: fixed-seed random inputs on the device, the
   output poisoned (NaN) and one run checked against float64 numpy, warm-up, `repeats` runs each
   between two events on one stream, median; the output is checked again after timing (an error
   that moves between runs is a race). A wrong or failing candidate is never "best";
3. the whole forward with the best candidate per layer, real images already on the device;
4. end to end: pinned host images -> host logits on S streams, the same pipeline jobs run
   (runner.pipeline_pass), events from the first H2D to the last D2H;
5. cuDNN, when PyTorch with CUDA is importable: the same layers on the same inputs (fp32 with
   TF32 off, TF32, fp16 channels_last) and the whole network, timed with torch.cuda.Event on a
   stream of its own after everything of ours finished; plus matmul rates (the FLOP ceilings);
   then what a user would run instead: the whole network as one CUDA graph replayed, and through
   torch.compile(mode="max-autotune"), in fp32 and fp16 channels_last (eager is cuDNN's row);
6. with --harness, after the GPU is released: `convsweep run-job` twice with events and twice
   under nsys; the second run of each hits the compile cache and its total_s is judged.

Everything measured lands in one dict; `build_result` derives rows, floors, ratios and verdicts
from it and `format_report` prints them. Both are pure and tested with fake numbers.

The package, one module per concern: `config` (the bench file), `report` (the pure numbers and
the table), `measure` (our kernels on the GPU), `cudnn` and `instead` (the optional PyTorch parts), `harness`
(real jobs through the CLI) and `run` (`run_bench`, every phase in order).
"""
from .config import DEFAULT_CONFIG, BenchConfig, Candidate, load_bench_config
from .report import CUDNN_MODES, build_result, format_report
from .run import BenchOptions, run_bench

__all__ = ["DEFAULT_CONFIG", "BenchConfig", "Candidate", "load_bench_config", "CUDNN_MODES", "build_result",
           "format_report", "BenchOptions", "run_bench"]
