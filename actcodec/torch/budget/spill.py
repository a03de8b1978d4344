"""Where paged-out saves go: a temporary file in the spill directory.

The directory is checked where a context or a Step is built (`check_dir`: it exists, is a
directory, and a file can be created there), so a bad one is named then, not mid-forward. A
write or read that fails or falls short raises an OSError with its errno (ENOSPC where the
disk is full) and the directory as its filename, saying how many bytes got through of how
many: the file itself has no name (it is unlinked at once) and so is never the one named.
"""
from __future__ import annotations

import errno
import os
import tempfile
import threading

import numpy as np
import torch

# What creating a file answers where the directory is not writable: PermissionError for all,
# with the errno the system gave (EROFS on a read-only mount is no PermissionError by itself).
NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def check_dir(directory) -> str | None:
    """`directory` as a path, after checking that paged saves can go there (None: the
    system's temporary directory, checked where it is used). Creates and removes one empty
    temporary file: the mode bits alone do not say (they do not stop root, and a read-only
    mount or a full inode table stops everyone)."""
    if directory is None:
        return None
    path = os.fspath(directory)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "spill_dir does not exist", path)
    if not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "spill_dir is not a directory", path)
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise _named(e, f"spill_dir is not writable: no file can be created there "
                        f"({e.strerror or e})", path) from e
    return path


def _named(e: OSError, message: str, path: str) -> OSError:
    """An OSError of e's kind and errno, saying `message` about `path`."""
    if e.errno in NOT_WRITABLE:
        return PermissionError(e.errno, message, path)
    return OSError(e.errno, message, path)  # OSError picks the subclass its errno names


class Spill:
    """A temporary file that payloads are paged out to and read back from."""

    def __init__(self, directory: str | None = None):
        self.directory, self.file, self.end, self.live = directory, None, 0, 0
        self.lock = threading.Lock()

    @property
    def where(self) -> str:
        """The directory the file is in, as errors name it."""
        return self.directory if self.directory is not None else tempfile.gettempdir()

    def write(self, arrays) -> list:
        """Writes each uint8 array (numpy or CPU tensor); returns where each went."""
        with self.lock:
            if self.file is None:
                try:
                    self.file = tempfile.TemporaryFile(dir=self.directory)
                except OSError as e:
                    raise _named(e, f"actcodec: cannot create the file saves are paged out to "
                                    f"in spill_dir ({e.strerror or e})", self.where) from e
            where = []
            for a in arrays:
                data = np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a)
                self._write_all(memoryview(data).cast("B"), self.end)
                where.append((self.end, data.nbytes))
                self.end += data.nbytes
            self.live += 1
            return where

    def _write_all(self, view: memoryview, offset: int) -> None:
        """Writes all of `view` at `offset` (a short write goes on where it stopped: the
        next write says why it stopped, ENOSPC on a full disk)."""
        done, total = 0, len(view)
        while done < total:
            try:
                n = os.pwrite(self.file.fileno(), view[done:], offset + done)
            except OSError as e:
                self._give_back_partial()
                raise _named(e, f"actcodec: paging out to spill_dir wrote {done} of {total} "
                                f"bytes ({e.strerror or e})", self.where) from e
            if n <= 0:  # no progress and no error: a write that would loop for ever
                self._give_back_partial()
                raise OSError(errno.EIO, f"actcodec: paging out to spill_dir wrote {done} of "
                                         f"{total} bytes (the file took no more)", self.where)
            done += n

    def _give_back_partial(self) -> None:
        """A failed write's bytes back to the disk (they are what the next write needs)."""
        try:
            os.ftruncate(self.file.fileno(), self.end)
        except OSError:
            pass  # the error being raised is the one to report

    def read(self, where) -> list:
        """The arrays written at `where`, as uint8 CPU tensors."""
        out = []
        for offset, nbytes in where:
            t = torch.empty(nbytes, dtype=torch.uint8)
            try:
                got = os.preadv(self.file.fileno(), [memoryview(t.numpy())], offset) \
                    if nbytes else 0
            except OSError as e:
                raise _named(e, f"actcodec: reading {nbytes} paged-out bytes back from "
                                f"spill_dir ({e.strerror or e})", self.where) from e
            if got != nbytes:
                raise OSError(errno.EIO, f"actcodec: read {got} of {nbytes} paged-out bytes "
                                         f"back from spill_dir", self.where)
            out.append(t)
        return out

    def release(self) -> None:
        """One paged-out save is gone; the file is emptied when none is left."""
        with self.lock:
            self.live -= 1
            if self.live == 0 and self.file is not None:
                self.file.truncate(0)
                self.end = 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
