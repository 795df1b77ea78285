"""Git object ids computed in Python, so that trees and blobs can be checked
where git is absent (the patch-ng fallback, an unpacked archive)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import stat


def blob_id(data: bytes) -> str:
    """The id git gives a blob with this content (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_id(root: pathlib.Path) -> str:
    """The id of the git tree that `git add -A && git write-tree` would make of
    `root`: regular files (100644 or 100755), symlinks, and non-empty
    directories. A `.git` entry at any depth is left out, as git does."""
    entries: list[tuple[bytes, str, bytes]] = []
    with os.scandir(root) as it:
        for entry in it:
            if entry.name == ".git":
                continue
            path = pathlib.Path(entry.path)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                mode, oid = "120000", blob_id(os.readlink(path).encode())
            elif stat.S_ISDIR(st.st_mode):
                sub = tree_id(path)
                if sub == EMPTY_TREE:
                    continue  # git records no empty directories
                mode, oid = "40000", sub
            else:
                mode = "100755" if st.st_mode & 0o100 else "100644"
                oid = blob_id(path.read_bytes())
            # git sorts a directory's name as if it ended with "/".
            key = entry.name.encode() + (b"/" if mode == "40000" else b"")
            entries.append((key, mode, entry.name.encode() + b"\0" + bytes.fromhex(oid)))
    body = b"".join(mode.encode() + b" " + rest for _, mode, rest in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
