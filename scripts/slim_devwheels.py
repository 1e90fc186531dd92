"""Developers' device runs: repack .devwheels' pulp wheel with only the x86_64 Linux CBC solver.

prepare.sh (shared/device) fills .devwheels with 71 MB of wheels, over the 64 MiB a device run may
carry; pulp (a Snakemake dependency) ships CBC binaries for six platforms, 13 MB of them for others.
Run from the repository root after prepare.sh: `python3 scripts/slim_devwheels.py`.
"""
import base64
import csv
import glob
import hashlib
import io
import zipfile


def keep(name: str) -> bool:
    return "solverdir/cbc/" not in name or "/linux/i64/" in name


def main() -> None:
    for wheel in glob.glob(".devwheels/pulp-*.whl"):
        with zipfile.ZipFile(wheel) as src:
            record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
            buffer, rows = io.BytesIO(), []
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
                for info in src.infolist():
                    if info.filename == record or not keep(info.filename):
                        continue
                    data = src.read(info)
                    out.writestr(info, data)
                    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    rows.append([info.filename, f"sha256={digest}", str(len(data))])
                rows.append([record, "", ""])  # a wheel's RECORD lists itself without a hash
                text = io.StringIO()
                csv.writer(text, lineterminator="\n").writerows(rows)
                out.writestr(record, text.getvalue())
        with open(wheel, "wb") as f:
            f.write(buffer.getvalue())
        print(f"{wheel}: {len(buffer.getvalue()):,} bytes")


if __name__ == "__main__":
    main()
