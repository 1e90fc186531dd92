"""The nsys SQLite reader, on an export built here with the tables and columns nsys 2025.3 writes.

The same code runs on real reports in the gpu-marked tests (tests/test_gpu.py).
"""
import sqlite3

import pytest

from convsweep.device.nsys import find_nsys, nsys_version, read_activities, summarize

TID = 77


class Export:
    def __init__(self, path):
        self.db = sqlite3.connect(path)
        self.db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, globalTid INT, textId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT, correlationId INT, nameId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, streamId INT, correlationId INT, shortName INT,
            gridX INT, gridY INT, gridZ INT, blockX INT, blockY INT, blockZ INT, registersPerThread INT,
            staticSharedMemory INT, dynamicSharedMemory INT, localMemoryPerThread INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, streamId INT, correlationId INT, bytes INT, copyKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT, end INT, deviceId INT, contextId INT, streamId INT,
            correlationId INT, globalPid INT, value INT, bytes INT, graphNodeId INT, memKind INT);
        CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INT, name TEXT);
        INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'CUDA_MEMCPY_OPER_HTOD'), (2, 'CUDA_MEMCPY_OPER_DTOH');
        """)
        self.corr = 0
        self.strings = {}

    def string(self, text):
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
            self.db.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[text], text))
        return self.strings[text]

    def nvtx(self, start, end, text, by_id=False):
        if by_id:
            self.db.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, NULL, ?, ?)", (start, end, TID, self.string(text)))
        else:
            self.db.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL)", (start, end, text, TID))

    def _call(self, at):
        self.corr += 1
        self.db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 0)", (at, at + 5, TID, self.corr))
        return self.corr

    def kernel(self, at, start, end, name, stream=7):
        corr = self._call(at)
        self.db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?, 10,4,1, 16,16,1, 32, 0, 0, 0)",
                        (start, end, stream, corr, self.string(name)))

    def copy(self, at, start, end, kind, nbytes, stream=7):
        corr = self._call(at)
        self.db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?)", (start, end, stream, corr, nbytes, kind))

    def memset(self, at, start, end, nbytes, stream=7):
        corr = self._call(at)
        self.db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?,?,0,1,?,?,0,0,?,0,1)",
                        (start, end, stream, corr, nbytes))

    def close(self):
        self.db.commit()
        self.db.close()


def one_pass(ex, t0, tag, conv1_ns, conv2_ns):
    """A serial forward: H2D, conv1, pool, conv2, D2H; CPU calls at t0.., GPU work at t0+1000.."""
    ex.nvtx(t0, t0 + 900, tag, by_id=True)
    ex.nvtx(t0 + 100, t0 + 200, "conv1")
    ex.nvtx(t0 + 300, t0 + 400, "conv2")
    g = t0 + 1000
    ex.copy(t0 + 10, g, g + 500, 1, 4000)
    ex.kernel(t0 + 150, g + 500, g + 500 + conv1_ns, "conv_forward")
    g += 500 + conv1_ns
    ex.kernel(t0 + 250, g, g + 100, "maxpool2d")
    ex.kernel(t0 + 350, g + 100, g + 100 + conv2_ns, "conv_forward")
    g += 100 + conv2_ns
    ex.copy(t0 + 500, g, g + 50, 2, 40)
    return g + 50


def test_serial_passes_are_attributed_to_repeats_and_layers(tmp_path):
    ex = Export(tmp_path / "r.sqlite")
    one_pass(ex, 0, "warmup 0", 9_000_000, 9_000_000)  # warm-up: ignored
    for r in range(3):
        one_pass(ex, 100_000_000 * (r + 1), f"repeat {r}", 1_000_000 * (r + 1), 2_000_000)
    ex.close()
    acts = read_activities(tmp_path / "r.sqlite", {"conv1", "conv2"})
    assert {a.repeat for a in acts} == {None, 0, 1, 2}
    s = summarize(acts, ["conv1", "conv2"])
    assert s["repeats_seen"] == 3
    assert s["op_time_ms"] == {"conv1": pytest.approx(2.0), "conv2": pytest.approx(2.0)}
    assert s["h2d_ms"] == pytest.approx(500e-6) and s["d2h_ms"] == pytest.approx(50e-6)
    assert s["overlap"] == 0.0 and s["streams_used"] == 1
    # forward: first H2D start to last D2H end of repeat 1 (conv1 2 ms)
    assert s["forward_ms"] == pytest.approx((500 + 2_000_000 + 100 + 2_000_000 + 50) / 1e6)
    conv = [k for k in s["kernels"] if k["name"] == "conv_forward"]
    assert {k["layer"] for k in conv} == {"conv1", "conv2"} and all(k["launches"] == 3 for k in conv)
    assert {m["kind"]: m["count"] for m in s["memcpys"]} == {"H2D": 3, "D2H": 3}
    assert len([x for x in s["samples"] if x["metric"] == "op_time_ms"]) == 6


def test_a_discarded_pass_is_left_out_and_the_counted_ones_numbered_in_order(tmp_path):
    ex = Export(tmp_path / "r.sqlite")
    for r in range(4):  # repeat 1 ran on a round that was not visibly new: 9 ms that must not count
        one_pass(ex, 100_000_000 * (r + 1), f"repeat {r}", 9_000_000 if r == 1 else 1_000_000, 2_000_000)
    ex.close()
    s = summarize(read_activities(tmp_path / "r.sqlite", {"conv1", "conv2"}), ["conv1", "conv2"], discarded=[1])
    assert s["repeats_seen"] == 3 and s["op_time_ms"]["conv1"] == pytest.approx(1.0)
    assert sorted({x["repeat"] for x in s["samples"]}) == [0, 1, 2]
    assert all(k["launches"] == 3 for k in s["kernels"])


def test_overlap_and_concurrent_streams(tmp_path):
    ex = Export(tmp_path / "o.sqlite")
    ex.nvtx(0, 1000, "repeat 0")
    ex.nvtx(10, 20, "conv1")
    # stream 1 copies 0..1000 ns while stream 2 computes 500..1500: half the copy is hidden
    ex.copy(5, 10_000, 11_000, 1, 100, stream=1)
    ex.kernel(15, 10_500, 11_500, "conv_forward", stream=2)
    ex.close()
    s = summarize(read_activities(tmp_path / "o.sqlite", {"conv1"}), ["conv1"])
    assert s["overlap"] == pytest.approx(0.5)
    assert s["streams_used"] == 2
    assert s["forward_ms"] == pytest.approx(1500 / 1e6)


def test_export_without_copies_or_nvtx(tmp_path):
    db = sqlite3.connect(tmp_path / "e.sqlite")
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    db.commit()
    db.close()
    acts = read_activities(tmp_path / "e.sqlite", {"conv1"})
    assert acts == [] and summarize(acts, ["conv1"])["op_time_ms"] == {"conv1": None}


def test_a_cold_pass_leaves_its_l2_flushes_out_of_its_times(tmp_path):
    """Cold cache: a memset over L2 before each conv layer (NVTX "l2 flush", no layer), on the pass's
    one stream. The layers' op times never held it; the pass's time leaves it out, and says how long."""
    ex = Export(tmp_path / "c.sqlite")
    ex.memset(5, 10, 20, 1 << 20)  # the logits' poison, before any repeat: not a flush
    ex.nvtx(50, 900, "repeat 0")
    ex.nvtx(100, 200, "conv1")
    ex.nvtx(300, 400, "conv2")
    ex.nvtx(80, 90, "l2 flush")
    ex.nvtx(280, 290, "l2 flush")
    g = 1000
    ex.copy(60, g, g + 500, 1, 4000)
    ex.memset(85, g + 500, g + 30_500, 100 << 20)
    ex.kernel(150, g + 30_500, g + 31_500, "conv_forward")
    ex.memset(285, g + 31_500, g + 61_500, 100 << 20)
    ex.kernel(350, g + 61_500, g + 63_500, "conv_forward")
    ex.copy(500, g + 63_500, g + 63_550, 2, 40)
    ex.close()
    acts = read_activities(tmp_path / "c.sqlite", {"conv1", "conv2"})
    assert [a.repeat for a in acts if a.kind == "memset"] == [None, 0, 0]
    s = summarize(acts, ["conv1", "conv2"])
    assert s["op_time_ms"] == {"conv1": pytest.approx(1000e-6), "conv2": pytest.approx(2000e-6)}
    assert s["forward_ms"] == pytest.approx((63_550 - 60_000) / 1e6)  # the span, less the two flushes
    assert [x["value"] for x in s["samples"] if x["metric"] == "l2_flush_ms"] == [pytest.approx(60_000 / 1e6)]
    assert {m["kind"] for m in s["memcpys"]} == {"H2D", "D2H"}  # a flush is not a copy


def executable(path, text="#!/bin/sh\necho 'NVIDIA Nsight Systems version 2099.1.1'\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_nsys_is_found_only_where_it_can_run(tmp_path, monkeypatch):
    """$NSYS wins over PATH; a $NSYS naming nothing (or a file that cannot run) is no nsys: a job asking
    for it fails at once instead of when its profile cannot start."""
    on_path = executable(tmp_path / "bin" / "nsys")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.delenv("NSYS", raising=False)
    assert find_nsys() == str(on_path)
    own = executable(tmp_path / "opt" / "nsys")
    monkeypatch.setenv("NSYS", str(own))
    assert find_nsys() == str(own)
    monkeypatch.setenv("NSYS", str(tmp_path / "nowhere" / "nsys"))
    assert find_nsys() is None
    (tmp_path / "plain").write_text("not a program")
    monkeypatch.setenv("NSYS", str(tmp_path / "plain"))
    assert find_nsys() is None


def test_nsys_version_is_read_where_the_cache_cannot_keep_it(tmp_path, monkeypatch):
    """The remembered version is a cache: a cache folder that cannot be written (here a file stands
    where it would be) costs the next job a question to nsys, not the job."""
    nsys = executable(tmp_path / "bin" / "nsys")
    (tmp_path / "cache").write_text("a file, not a folder")
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))
    assert nsys_version(str(nsys)) == "2099.1.1"
