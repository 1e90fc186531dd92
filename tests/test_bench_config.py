"""The bench file: defaults, shorthand, and one line naming file and key for every mistake."""
import pytest

from convsweep import bench
from convsweep.model.checks import TOLERANCE
from convsweep.base.errors import ConfigError
from convsweep.device.gpu import HOST_MEMORY_KINDS
from convsweep.base.paths import ROOT
from convsweep.base.schema import load_schema

from bench_files import GOOD, write

def test_default_bench_file_is_valid():
    config = bench.load_bench_config("bench/default.yaml")
    assert config.batch == 10000 and config.repeats == 20
    assert [c.variant for c in config.candidates["conv1"]][:3] == ["register_tiled_gemm", "restrict_unroll", "fused_conv_relu_pool"]
    assert [c.variant for c in config.candidates["conv2"]][:3] == ["register_tiled_gemm", "wmma_16x16x16", "fp16"]
    first = config.candidates["conv1"][0]
    assert first.params == {"BLOCK_M": 4, "BLOCK_N": 256, "BLOCK_K": 8, "THREAD_M": 4, "THREAD_N": 4}
    assert first.resolved == first.params  # every tunable given
    assert config.candidates["conv2"][0].resolved["BLOCK_M"] == 16  # registry default filled in
    assert config.targets["ms"] == {"conv1": 0.21, "conv2": {"fp32": 0.8, "tf32": 0.8, "fp16": 0.2}, "forward": 0.2,
                                    "end_to_end": {"fp32": 5.45, "fp16": 2.8, "u8": 1.45, "u8-source": 0.45},
                                    "end_to_end_small": 0.06,  # issue 33's, per input format
                                    "harness_events": 2000, "harness_nsys": 5000}  # issue 16's, and round one's harness
    assert config.targets["batch"] == 10000
    assert config.end_to_end == {"streams": 4, "host_memory": "pinned", "chunk_images": 1250, "graph": True,
                                 "inputs": ["fp32", "fp16", "u8", "u8-source"],
                                 "small_batch": {"batch": 100, "chunk_images": 100}}


def test_good_file_and_shorthand(tmp_path):
    config = bench.load_bench_config(write(tmp_path, GOOD))
    assert [c.variant for c in config.candidates["conv1"]] == ["register_tiled_gemm", "restrict_unroll"]
    assert config.copy_mib == 1 and config.harness == {"repeats": 5, "warmup": 1}


@pytest.mark.parametrize("edit, key, expected", [
    (("candidates:", "candidatez: {}\ncandidates:"), "(top level)", "unknown key ('candidatez' was unexpected)"),
    (("- restrict_unroll", "- {variant: restrict_unroll, parms: {}}"), "candidates.conv1[1]", "unknown key ('parms'"),
    (("- restrict_unroll", "- 3"), "candidates.conv1[1]", "expected ['string', 'object'], got 3"),
    (("- {variant: fp16}", "- {params: {BLOCK: 64}}"), "candidates.conv2[1]", "'variant' is a required property"),
    (("  conv2:\n", "  conv2: []\n  conv0:\n"), "candidates.conv2", "must not be empty"),
    (("- restrict_unroll", "- {variant: nope}"), "candidates.conv1[1].variant", "unknown variant 'nope'"),
    (("- restrict_unroll", "- reference"), "candidates.conv1[1].variant", "expected a GPU variant"),
    (("- {variant: fp16}", "- {variant: fp16, params: {TILE: 8}}"), "candidates.conv2[1].params.TILE", "no tunable"),
    (("- {variant: fp16}", "- {variant: fp16, params: {BLOCK: 3}}"), "candidates.conv2[1].params.BLOCK", "not an allowed value"),
    (("  conv2:", "  conv3:"), "candidates.conv3", "expected a conv layer of lenet86 (conv1, conv2)"),
    (("forward: 1.0", "forward: -1"), "targets.ms.forward", "expected more than 0, got -1"),
    (("forward: 1.0", "forward: {fp32: 1.0}"), "targets.ms.forward", "expected number"),
    (("conv1: 0.6", "conv1: {}"), "targets.ms.conv1", "must not be empty"),
    (("batch: 64\n  device", "batch: 0\n  device"), "targets.batch", "expected at least 1, got 0"),
    (("forward: 1.0", "fwd: 1.0"), "targets.ms.fwd", "unknown key"),
    (("fp16: 0.5", "fp61: 0.5"), "targets.ms.conv2", "unknown key ('fp61' was unexpected)"),
    (("repeats: 3", "repeats: 0"), "repeats", "expected at least 1, got 0"),
    (("repeats: 3", "repeats: 3.5"), "repeats", "expected integer, got 3.5"),
    (("warmup: 1", "cudnn_benchmark: yes please"), "cudnn_benchmark", "expected boolean"),
    (("copy_mib: 1", "copy_mib: 1\nharness: {warmup: -1}"), "harness.warmup", "expected at least 0, got -1"),
    (("copy_mib: 1", "copy_mib: 1\nend_to_end: {chunk_images: 0}"), "end_to_end.chunk_images", "expected at least 1, got 0"),
    (("copy_mib: 1", "copy_mib: 1\nend_to_end: {host_memory: paged}"), "end_to_end.host_memory", "expected one of"),
    (("copy_mib: 1", "copy_mib: 1\nend_to_end: {host_memory: pageable}"), "end_to_end.graph",
     "cannot capture copies from pageable memory"),
    (("copy_mib: 1", "copy_mib: 1\nend_to_end: {small_batch: {chunk_images: 5}}"), "end_to_end.small_batch",
     "batch"),
    (("network: networks/lenet86.yaml", "network: networks/nope.yaml"), "network", "expected an existing network"),
    (("network: networks/lenet86.yaml", "network: networks/fp64_stride5.yaml"), "network", "expected a float32 network"),
])
def test_bad_file_is_one_line_naming_file_and_key(tmp_path, edit, key, expected):
    old, new = edit
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        bench.load_bench_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: "), message
    assert expected in message


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        bench.load_bench_config(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        bench.load_bench_config(write(tmp_path, "candidates: [\n"))
    with pytest.raises(ConfigError, match=r"\(top level\): 'candidates' is a required property"):
        bench.load_bench_config(write(tmp_path, "batch: 3\n"))
    with pytest.raises(ConfigError, match=r"\(top level\): expected object, got null"):
        bench.load_bench_config(write(tmp_path, ""))


def test_defaults_come_from_the_schema(tmp_path):
    config = bench.load_bench_config(write(tmp_path, "candidates: {conv1: [naive]}\n"))
    assert config.network_path == ROOT / "networks/lenet86.yaml" and config.dataset == "mnist5k"
    assert (config.batch, config.repeats, config.warmup, config.seed) == (10000, 20, 3, 0)
    assert (config.check_images, config.copy_mib, config.cudnn_benchmark) == (8, 1024, True)
    assert config.end_to_end == {"streams": 4, "host_memory": "pinned", "chunk_images": None, "graph": True,
                                 "inputs": ["fp32"], "small_batch": None}
    assert config.harness == {"repeats": 5, "warmup": 1}
    assert config.targets == {"batch": 10000, "device": None, "ms": {}}  # targets.batch: the file's batch
    (candidate,) = config.candidates["conv1"]
    assert candidate.params == {} and candidate.resolved == {"BLOCK": 256}


TINY = """name: tiny
input: [1, 12, 12]
weights: random
layers:
  - {name: conv1, type: conv2d, out_channels: 4, kernel: 3}
  - {name: flatten, type: flatten}
  - {name: fc1, type: dense, out_features: 10}
"""


def test_network_beside_the_file_and_what_its_layers_allow(tmp_path):
    (tmp_path / "networks").mkdir()
    (tmp_path / "networks" / "lenet86.yaml").write_text(TINY)  # beside the bench file wins over the checkout's
    config = bench.load_bench_config(write(tmp_path, "candidates: {conv1: [naive]}\ntargets: {ms: {conv1: 1}}\n"))
    assert config.network.name == "tiny" and config.network_path == tmp_path / "networks" / "lenet86.yaml"
    assert config.targets["ms"] == {"conv1": 1.0}
    path = write(tmp_path, "candidates: {conv1: [fused_conv_relu_pool]}\n")
    with pytest.raises(ConfigError, match=r"candidates.conv1\[0\].variant: .*followed by flatten"):
        bench.load_bench_config(path)
    path = write(tmp_path, "network: networks/conv256.yaml\ncandidates: {conv1: [constant_weights]}\n")
    with pytest.raises(ConfigError, match=r"candidates.conv1\[0\].variant: .*needs M \* C \* K \* K <= 16384"):
        bench.load_bench_config(path)
    path = write(tmp_path, "candidates: {conv1: [naive]}\ntargets: {ms: {conv2: 1}}\n")
    with pytest.raises(ConfigError, match=r"targets.ms.conv2: unknown key \(expected a conv layer of tiny \(conv1\)"):
        bench.load_bench_config(path)


def test_schema_enums_agree_with_the_code():
    schema = load_schema("bench")
    assert tuple(schema["properties"]["end_to_end"]["properties"]["host_memory"]["enum"]) == HOST_MEMORY_KINDS
    conv_target = schema["properties"]["targets"]["properties"]["ms"]["additionalProperties"]
    assert list(conv_target["properties"]) == list(TOLERANCE)
