"""A TPU cell bundle too large for one call to the host, in parts
(docs/tpu-cell.md): made here by `tpu-cell bundle` (`split`), carried to the
host one or more parts a call, staged in a host folder across calls, and
put together there (`assemble`) only when every part is there and matches
the parts' SHA256SUMS.

Standard library only, Python 3.11: on the host it runs before anything is
installed, from the checkout every call carries:

    python3 overlay/maxtext_rl_overlay/tpucell/parts.py PARTS_DIR --stage HOST_DIR [--into BUNDLE]

PARTS_DIR holds the parts this call carried and their SHA256SUMS (always
carried: it is small); each part there is checked and copied into
HOST_DIR (a folder that outlives the call while the host stays warm, such
as one under /tmp). With --into, the bundle is put together from HOST_DIR
into BUNDLE when every part is there; otherwise it exits 1 naming the parts
missing (nothing is put together), and a part whose sha256 differs from
SHA256SUMS is refused (exit 1) naming it.

A part, bundle-part-N-of-M.tar, holds whole files of the bundle (each
under its path in the bundle): the parts together hold every file once.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import re
import shutil
import sys
import tarfile

#: The parts' checksums, in the parts folder (`sha256  NAME` lines, as sha256sum writes them).
SUMS = "SHA256SUMS"
#: Written into a bundle put together from parts: which parts, checked how (cell.json's `bundle.parts`).
RECEIVED = "PARTS-RECEIVED.json"
PART_NAME = re.compile(r"^bundle-part-(\d+)-of-(\d+)\.tar$")
#: tar's own bytes per file (a header block) and at the end (two zero blocks, padded to a 10 KiB record).
TAR_BLOCK = 512
TAR_END = 10240


class PartsError(Exception):
    """What stops a bundle's parts being staged or put together (the message says what to do)."""


def part_name(n: int, m: int) -> str:
    return f"bundle-part-{n}-of-{m}.tar"


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tar_bytes(size: int) -> int:
    """At most what one file of `size` bytes takes in a tar: its header, a
    PAX extended header where its name or metadata need one (a header and a
    block), and its blocks."""
    return 3 * TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


def split(bundle: pathlib.Path, dest: pathlib.Path, max_bytes: int, *, skip: tuple[str, ...] = ()) -> list[pathlib.Path]:
    """Every file under `bundle` (but the top-level names in `skip`) into
    parts of at most `max_bytes` each in `dest` (absent or empty), and
    dest/SHA256SUMS; the parts, in order. The largest files are placed first,
    each into the first part with room (a file that fits no part alone is an
    error)."""
    files = sorted((p for p in bundle.rglob("*") if p.is_file() and p.relative_to(bundle).parts[0] not in skip),
                   key=lambda p: (-p.stat().st_size, str(p)))
    bins: list[list[pathlib.Path]] = []
    room: list[int] = []
    for path in files:
        need = _tar_bytes(path.stat().st_size)
        if need > max_bytes - TAR_END:
            raise PartsError(f"{path.relative_to(bundle)} is {path.stat().st_size / 2**20:.1f} MiB: it fits no part of at most "
                             f"{max_bytes / 2**20:.1f} MiB (give a larger part size).")
        at = next((i for i, left in enumerate(room) if left >= need), None)
        if at is None:
            bins.append([])
            room.append(max_bytes - TAR_END)
            at = len(bins) - 1
        bins[at].append(path)
        room[at] -= need
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise PartsError(f"{dest}: not empty; the parts go into an empty folder.")
    parts = []
    for n, members in enumerate(bins, 1):
        part = dest / part_name(n, len(bins))
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(members):
                tar.add(path, arcname=str(path.relative_to(bundle)), recursive=False)
        if part.stat().st_size > max_bytes:  # the estimate above is tar's own layout: never expected
            raise PartsError(f"{part.name} came out {part.stat().st_size} bytes, over the {max_bytes} asked for.")
        parts.append(part)
    (dest / SUMS).write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in parts))
    return parts


def read_sums(folder: pathlib.Path) -> dict[str, str]:
    """name -> sha256 of the parts' SHA256SUMS in `folder` (every part, 1 to M, named there)."""
    path = folder / SUMS
    if not path.is_file():
        raise PartsError(f"{path}: absent. Carry the parts' {SUMS} with every part (it names them all and their sha256).")
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(None, 1)
            sums[name.strip().lstrip("*")] = digest
    counts = {m.group(2) for m in map(PART_NAME.match, sums) if m}
    if not sums or len(counts) != 1 or any(PART_NAME.match(n) is None for n in sums):
        raise PartsError(f"{path}: not the SHA256SUMS of a bundle's parts (bundle-part-N-of-M.tar, one M).")
    m = int(counts.pop())
    if sorted(sums) != sorted(part_name(n, m) for n in range(1, m + 1)):
        raise PartsError(f"{path}: names {len(sums)} part(s), not the {m} of a bundle.")
    return sums


def stage(parts: pathlib.Path, host_dir: pathlib.Path) -> tuple[dict[str, str], list[str]]:
    """The parts in `parts` checked against its SHA256SUMS and copied into
    `host_dir` (with the sums); (the sums, the parts still missing there).
    A part in `parts` that differs from its sum is refused; one in
    `host_dir` that does (an earlier bundle's) counts as missing."""
    sums = read_sums(parts)
    host_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in sorted(sums.items()):
        carried = parts / name
        if carried.is_file() and carried.resolve() != (host_dir / name).resolve():
            got = sha256_file(carried)
            if got != digest:
                raise PartsError(f"{carried}: sha256 {got}, its {SUMS} says {digest}: the copy is damaged (or of another bundle); "
                                 "carry it again.")
            tmp = host_dir / f".{name}.partial"
            shutil.copyfile(carried, tmp)
            os.replace(tmp, host_dir / name)
    shutil.copyfile(parts / SUMS, host_dir / f".{SUMS}.partial")
    os.replace(host_dir / f".{SUMS}.partial", host_dir / SUMS)
    missing = [name for name, digest in sorted(sums.items(), key=lambda item: int(PART_NAME.match(item[0]).group(1)))  # type: ignore[union-attr]
               if not (host_dir / name).is_file() or sha256_file(host_dir / name) != digest]
    return sums, missing


def assemble(host_dir: pathlib.Path, into: pathlib.Path, sums: dict[str, str]) -> list[str]:
    """The bundle put together in `into` from every part in `host_dir`
    (each checked against `sums` again); the files, in a folder beside
    `into` first, then moved into it. `into` may hold anything (the
    carried parts' folder, an earlier put-together of the same bundle):
    each of the bundle's paths is replaced."""
    for name, digest in sums.items():
        got = sha256_file(host_dir / name) if (host_dir / name).is_file() else "absent"
        if got != digest:
            raise PartsError(f"{host_dir / name}: {got}, its {SUMS} says {digest}: stage it again.")
    into.mkdir(parents=True, exist_ok=True)
    work = into.parent / f".{into.name}.assembling"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    names = []
    try:
        for name in sorted(sums, key=lambda n: int(PART_NAME.match(n).group(1))):  # type: ignore[union-attr]
            with tarfile.open(host_dir / name) as tar:
                for member in tar.getmembers():
                    if not member.isfile() or member.name.startswith("/") or ".." in pathlib.PurePosixPath(member.name).parts:
                        raise PartsError(f"{name}: {member.name!r} is not a bundle's file: refused.")
                    names.append(member.name)
                tar.extractall(work, filter="data")
        for top in sorted({pathlib.PurePosixPath(n).parts[0] for n in names}):
            if (into / top).is_dir() and not (into / top).is_symlink():
                shutil.rmtree(into / top)
            elif (into / top).exists() or (into / top).is_symlink():
                (into / top).unlink()
            os.replace(work / top, into / top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    received = {"parts": [{"name": n, "sha256": sums[n], "bytes": (host_dir / n).stat().st_size} for n in sorted(sums)],
                "files": len(names), "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (into / RECEIVED).write_text(json.dumps(received, indent=1) + "\n")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parts.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", type=pathlib.Path, metavar="PARTS_DIR", help=f"the parts this call carried, and their {SUMS}")
    parser.add_argument("--stage", type=pathlib.Path, required=True, metavar="HOST_DIR", help="where the parts gather across calls")
    parser.add_argument("--into", type=pathlib.Path, metavar="BUNDLE", help="put the bundle together there (every part staged)")
    args = parser.parse_args(argv)
    try:
        sums, missing = stage(args.parts, args.stage)
        have = [n for n in sums if n not in missing]
        print(f"tpu-cell parts: {len(have)} of {len(sums)} staged in {args.stage}" + (f": {', '.join(sorted(have))}" if have else ""))
        if missing:
            print(f"tpu-cell parts: missing {', '.join(missing)}: carry {'it' if len(missing) == 1 else 'them'} with {SUMS} "
                  f"(each call: {args.parts}/PART and {args.parts}/{SUMS}), staged into {args.stage}", file=sys.stderr)
            if args.into:
                print(f"tpu-cell parts: the bundle is NOT put together in {args.into}, nor installed: parts missing", file=sys.stderr)
                return 1
            return 0
        if args.into:
            names = assemble(args.stage, args.into, sums)
            print(f"tpu-cell parts: the bundle put together in {args.into} from {len(sums)} parts ({len(names)} files); "
                  f"next: bash {args.into}/run.sh --report DIR --steps install,...")
    except PartsError as exc:
        print(f"tpu-cell parts: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
