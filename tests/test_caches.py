"""What convsweep reads back from its cache directory is checked first (fileio.SealedCache): a build, a
float64 reference or an upscaled image set that was changed, cut short, forged, moved, linked or left by
another user is removed and made again, never returned."""
import gzip
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from convsweep.inputs import data, batch as inputs
from convsweep.device.compile import compile_variant
from convsweep.base.fileio import SEAL_KEY_NAME, SealedCache, payload_digest
from convsweep.model.network import load_network, load_weights
from convsweep.base.paths import ROOT
from convsweep.model.variants import load_registry

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# --- an entry taken apart and put together again, as someone with write access to the directory would


def entry_parts(path: Path) -> tuple[bytes, dict, bytes]:
    """(its seal, its header's fields, its payload)."""
    raw = path.read_bytes()
    head, rest = raw.split(b"\n", 1)
    header, payload = rest.split(b"\n", 1)
    return head.rsplit(b" ", 1)[1], json.loads(header), payload


def put_together(path: Path, fields: dict, payload: bytes, secret: bytes | None = None, seal: bytes | None = None):
    """The entry written back with `fields` and `payload`, sealed with `secret` (or the seal given as is)."""
    header = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-(len(b"CONVSWEEP-SEALED 1 ") + 65 + len(header) + 1) % 64)
    if secret is not None:
        seal = hmac.new(secret, header, hashlib.sha256).hexdigest().encode()
    path.write_bytes(b"CONVSWEEP-SEALED 1 " + seal + b"\n" + header + b"\n" + payload)


def own_secret(root: Path) -> bytes:
    return (root / SEAL_KEY_NAME).read_bytes()


# --- the three caches, each used the way convsweep uses it


class Builds:
    """The build cache: naive for sm_90 (and BLOCK 128 as another entry)."""

    def __init__(self, root: Path, monkeypatch):
        monkeypatch.setenv("CONVSWEEP_CACHE", str(root))
        self.root, self.variant = root, load_registry()["naive"]

    def use(self, other: bool = False):
        params = {**self.variant.defaults(), **({"BLOCK": 128} if other else {})}
        build = compile_variant(self.variant, params, "sm_90")
        return build, not build.cache_hit

    @staticmethod
    def same(a, b) -> bool:  # not the log: ptxas writes its own compile time into it
        return (a.cubin, a.kernels, a.findings) == (b.cubin, b.kernels, b.findings)

    @staticmethod
    def changed_payload(payload: bytes) -> bytes:
        middle = len(payload) // 2
        return payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1 :]

    entries = "kernels/*.sealed"


class References:
    """The float64 reference cache: LeNet-86 on three images (another entry: the same images, another name)."""

    def __init__(self, root: Path, monkeypatch):
        monkeypatch.setenv("CONVSWEEP_CACHE", str(root))
        self.root = root
        self.network = load_network(ROOT / "networks" / "lenet86.yaml")
        self.weights = load_weights(self.network)
        self.images = np.random.default_rng(5).random((3, *self.network.input_shape), dtype=np.float32)
        self.computed = 0
        real = inputs.reference_forward_parallel

        def counting(*args, **kwargs):
            self.computed += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(inputs, "reference_forward_parallel", counting)

    def use(self, other: bool = False):
        before = self.computed
        identity = ["images-of-this-test", *(["round", 1] if other else [])]
        logits = inputs.cached_forward(self.network, self.weights, identity, lambda: self.images)
        return np.array(logits), self.computed > before

    @staticmethod
    def same(a, b) -> bool:
        return a.dtype == b.dtype == np.float64 and np.array_equal(a, b)

    @staticmethod
    def changed_payload(payload: bytes) -> bytes:  # the same shape, every logit a little larger
        return (np.frombuffer(payload, np.float64) + 0.25).tobytes()

    entries = "reference/*.sealed"


class Images:
    """The cache of upscaled images: six 5x5 digits at 12x12 (another entry: at 13x13)."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.computed = root, 0
        raw = np.random.default_rng(3).integers(0, 256, (6, 5, 5), dtype=np.uint8)
        labels = np.arange(6, dtype=np.uint8) % 3
        self.files = [root.parent / "imgs.idx.gz", root.parent / "lbls.idx"]
        header = bytes([0, 0, 8, 3, 0, 0, 0, 6, 0, 0, 0, 5, 0, 0, 0, 5])  # IDX: uint8, 3 dimensions, 6x5x5
        self.files[0].write_bytes(gzip.compress(header + raw.tobytes()))
        self.files[1].write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 6]) + labels.tobytes())
        real = data.upscale_bilinear

        def counting(*args, **kwargs):
            self.computed += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(data, "upscale_bilinear", counting)

    def use(self, other: bool = False):
        before = self.computed
        dataset = data.load_dataset("t", images=self.files[0], labels=self.files[1], image_size=13 if other else 12,
                                    cache_dir=self.root)
        return np.array(dataset.images), self.computed > before

    @staticmethod
    def same(a, b) -> bool:
        return a.dtype == b.dtype == np.float32 and np.array_equal(a, b)

    @staticmethod
    def changed_payload(payload: bytes) -> bytes:  # a blank image set: a kernel that writes zeros would pass
        return bytes(len(payload))

    entries = "*.sealed"


CACHES = {"build": Builds, "reference": References, "images": Images}


def entry_of(cache) -> Path:
    [entry] = [p for p in cache.root.glob(cache.entries)]
    return entry


# --- what is done to an entry


def payload_changed(cache, entry: Path, tmp: Path):
    seal, fields, payload = entry_parts(entry)
    put_together(entry, fields, cache.changed_payload(payload), seal=seal)


def payload_changed_and_digest_fixed_under_another_secret(cache, entry: Path, tmp: Path):
    """What another user who can write the directory, but not read the secret, can make."""
    _, fields, payload = entry_parts(entry)
    payload = cache.changed_payload(payload)
    put_together(entry, {**fields, "digest": payload_digest(payload)}, payload, secret=secrets.token_bytes(32))


def record_changed(cache, entry: Path, tmp: Path):
    seal, fields, payload = entry_parts(entry)
    record = fields["record"]
    if "kernels" in record:  # a build: fewer registers and no findings than the cubin has
        record["kernels"][0]["registers"] = 1
        record["findings"] = {name: [] for name in record["findings"]}
    else:  # an array: what it was made from
        record["array"]["shape"] = [record["array"]["shape"][0] // 2, -1] + record["array"]["shape"][2:]
    put_together(entry, fields, payload, seal=seal)


def truncated(cache, entry: Path, tmp: Path):
    entry.write_bytes(entry.read_bytes()[:-16])


def cut_in_its_header(cache, entry: Path, tmp: Path):
    entry.write_bytes(entry.read_bytes()[:100])


def emptied(cache, entry: Path, tmp: Path):
    entry.write_bytes(b"")


def garbage(cache, entry: Path, tmp: Path):
    entry.write_bytes(b"\x7fELF" + os.urandom(500))


def symlinked(cache, entry: Path, tmp: Path):
    """The sound entry itself, but through a link: a link is never read through, whatever it names."""
    target = tmp / "elsewhere"
    shutil.move(entry, target)
    entry.symlink_to(target)


def another_entrys(cache, entry: Path, tmp: Path):
    """A sound entry of another key (another build, another reference) copied over this one."""
    cache.use(other=True)
    [other] = [p for p in cache.root.glob(cache.entries) if p != entry]
    shutil.copyfile(other, entry)


def another_users(cache, entry: Path, tmp: Path):
    os.chown(entry, 4242, 4242)


def a_fifo(cache, entry: Path, tmp: Path):
    entry.unlink()
    os.mkfifo(entry)


TAMPERINGS = [payload_changed, payload_changed_and_digest_fixed_under_another_secret, record_changed, truncated,
              cut_in_its_header, emptied, garbage, symlinked, another_entrys,
              pytest.param(another_users, marks=pytest.mark.skipif(not IS_ROOT, reason="chown needs root")),
              a_fifo]


@pytest.mark.parametrize("tamper", TAMPERINGS, ids=lambda t: getattr(t, "__name__", None))
@pytest.mark.parametrize("kind", CACHES)
def test_a_tampered_entry_is_made_again_and_never_returned(kind, tamper, tmp_path, monkeypatch):
    cache = CACHES[kind](tmp_path / "cache", monkeypatch)
    first, fresh = cache.use()
    assert fresh
    hit, fresh = cache.use()
    assert not fresh and cache.same(hit, first)  # a sound entry is used
    entry = entry_of(cache)

    tamper(cache, entry, tmp_path)
    again, fresh = cache.use()
    assert fresh, f"{kind}: a {tamper.__name__} entry was used"
    assert cache.same(again, first)
    assert stat.S_ISREG(entry.lstat().st_mode) and entry.stat().st_uid == os.geteuid()  # replaced by a sound one
    hit, fresh = cache.use()
    assert not fresh and cache.same(hit, first)
    if tamper is symlinked:
        assert (tmp_path / "elsewhere").is_file()  # the link was removed, not what it named


def test_an_entry_resealed_with_this_users_own_secret_is_used(tmp_path, monkeypatch):
    """The limit of the seal, and the control of the forgeries above: the same change sealed with the
    directory's own secret passes, so it is the secret they lacked. A process of this user can do this."""
    cache = Builds(tmp_path / "cache", monkeypatch)
    cache.use()
    entry = entry_of(cache)
    _, fields, payload = entry_parts(entry)
    fields["record"]["kernels"][0]["registers"] = 1
    put_together(entry, fields, payload, secret=own_secret(cache.root))
    build, fresh = cache.use()
    assert not fresh and build.kernels[0].registers == 1


def test_the_secret_is_the_users_alone_and_one_that_is_not_is_replaced(tmp_path, monkeypatch):
    cache = Builds(tmp_path / "cache", monkeypatch)
    key = cache.root / SEAL_KEY_NAME
    assert not key.exists()
    first, _ = cache.use()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    secret = key.read_bytes()

    key.chmod(0o644)  # others could read it: it no longer proves anything, so no entry is used
    again, fresh = cache.use()
    assert fresh and cache.same(again, first)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_bytes() != secret  # a new one, and entries under it
    assert not cache.use()[1]

    secret = key.read_bytes()
    key.unlink()
    (tmp_path / "planted").write_bytes(secret)
    (tmp_path / "planted").chmod(0o600)
    key.symlink_to(tmp_path / "planted")  # a link to the very secret: still not read through
    assert cache.use()[1]
    assert not key.is_symlink() and key.read_bytes() != secret


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_a_secret_of_another_user_is_not_used(tmp_path, monkeypatch):
    cache = References(tmp_path / "cache", monkeypatch)
    cache.use()
    key = cache.root / SEAL_KEY_NAME
    os.chown(key, 4242, 4242)
    assert cache.use()[1]
    assert key.stat().st_uid == os.geteuid() and not cache.use()[1]


def test_reading_makes_no_secret_and_a_missing_one_fails_every_entry(tmp_path):
    cache = SealedCache(tmp_path)
    assert cache.read("a.sealed", "k") is None and not (tmp_path / SEAL_KEY_NAME).exists()
    cache.write("a.sealed", "k", {"what": 1}, b"payload")
    record, payload = cache.read("a.sealed", "k")
    assert record == {"what": 1} and bytes(payload) == b"payload"
    (tmp_path / SEAL_KEY_NAME).unlink()
    assert cache.read("a.sealed", "k") is None and not (tmp_path / "a.sealed").exists()


def test_an_array_is_read_in_place_aligned_and_writable(tmp_path):
    cache = SealedCache(tmp_path)
    array = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    cache.write_array("x.sealed", "k", {"what": "numbers"}, array[:, ::-1])  # not contiguous: made so
    got = cache.read_array("x.sealed", "k")
    np.testing.assert_array_equal(got, array[:, ::-1])
    assert got.dtype == np.float64 and got.flags.writeable and got.ctypes.data % 16 == 0
    assert cache.read_array("x.sealed", "another key") is None and not (tmp_path / "x.sealed").exists()


def test_a_payload_over_many_pieces_has_one_digest_and_any_change_shows(tmp_path):
    payload = np.random.default_rng(0).integers(0, 256, (3 << 23) + 5, dtype=np.uint8)  # four pieces of 8 MiB
    digest = payload_digest(payload)
    assert digest == payload_digest(payload.tobytes())
    payload[(2 << 23) + 7] ^= 1
    assert payload_digest(payload) != digest
    assert payload_digest(b"") != payload_digest(b"\0")


def test_a_validated_registry_memo_changed_on_disk_is_made_again(tmp_path, monkeypatch):
    """The registry's memo (schema.validated_file) decides a variant's precision and so its tolerance: a memo
    changed on disk (fp32 -> fp16, 1e-5 -> 1e-2) must not be used."""
    from convsweep.base import schema
    from convsweep.base.paths import KERNELS_DIR

    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path))
    first = schema.validated_file(KERNELS_DIR / "variants.yaml", "variants")
    (memo,) = (tmp_path / "validated").glob("variants-*.sealed")
    raw = memo.read_bytes()
    assert raw.count(b'"precision": "fp32"') > 1
    memo.write_bytes(raw.replace(b'"precision": "fp32"', b'"precision": "fp16"'))
    assert schema.validated_file(KERNELS_DIR / "variants.yaml", "variants") == first  # made again from the file


def test_the_schema_file_snakemake_reads_is_checked_not_trusted(tmp_path, monkeypatch):
    from convsweep.base import schema

    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path))
    path = schema.schema_file("experiments")
    good = path.read_text()
    path.write_text(good.replace('"default": "full"', '"default": "fast"'))
    assert schema.schema_file("experiments").read_text() == good
    path.unlink()
    decoy = tmp_path / "decoy.json"
    decoy.write_text("{}")
    path.symlink_to(decoy)
    assert schema.schema_file("experiments").read_text() == good and not path.is_symlink() and decoy.read_text() == "{}"
