"""The run's published weights versions, kept so that a restarted learner numbers above them.

Actors never adopt a weights version at or below the one they hold, so a learner restarted from
an older checkpoint must not reuse numbers its predecessor published (it got further than its
last checkpoint). ``runs/NAME/weights-version`` holds, in one line:

* the highest version published, rewritten (without fsync) before each publish: it survives the
  learner process dying, as the write sits in the kernel's page cache;
* a ceiling, fsynced: before a version above it is published, it is raised by ``VERSION_BLOCK``,
  so a block of publishes costs one fsync and nothing published is above what the disk holds;
* the machine's boot id when the line was written.

A restart on the same boot continues from the highest version (contiguous numbers); after a
machine crash (another boot id, or another machine), whose page cache may have lost the last
writes, it continues from the ceiling, skipping at most a block of numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

from zmqrl.checkpoints.files import sync_directory, write_failure

# File in the run directory.
VERSION_FILE = "weights-version"
# Versions reserved per fsync of VERSION_FILE: what a restart after a machine crash may skip.
VERSION_BLOCK = 1_000
# Where Linux says which boot this is (absent elsewhere: then every restart uses the ceiling).
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# The line's fixed size: "highest ceiling boot-id", space-padded.
LINE_BYTES = 96


def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


class PublishedVersions:
    """The version file of one run; ``highest`` is what a restarted learner must number above."""

    def __init__(self, path: Path, block: int = VERSION_BLOCK) -> None:
        self.path = path
        self.block = block
        self._boot = boot_id()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            created = not path.exists()
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if created:
                sync_directory(path.parent)  # the file itself must survive a machine crash
            line = os.pread(self._fd, LINE_BYTES, 0)
        except OSError as exc:
            raise write_failure(path, exc, path.parent) from exc
        highest, self.ceiling, boot = _parse(line)
        same_boot = boot is not None and boot == self._boot
        self.highest = highest if same_boot else max(highest, self.ceiling)

    def reserve(self, version: int) -> None:
        """Call before publishing ``version``: on disk, the ceiling is at or above it, and the
        highest version says it (in the page cache: for a restart after the process died)."""
        if version <= self.highest:
            return
        try:
            if version > self.ceiling:
                self.ceiling = version + self.block - 1
                self._write(version)
                os.fsync(self._fd)
            else:
                self._write(version)
        except OSError as exc:
            raise write_failure(self.path, exc, self.path.parent) from exc
        self.highest = version

    def close(self) -> None:
        os.close(self._fd)

    def _write(self, highest: int) -> None:
        line = f"{highest} {self.ceiling} {self._boot or '-'}".ljust(LINE_BYTES - 1) + "\n"
        os.pwrite(self._fd, line.encode()[:LINE_BYTES], 0)


def _parse(line: bytes) -> tuple[int, int, str | None]:
    """(highest, ceiling, boot id) from the file's line; a file of earlier versions holds only the
    highest version (its ceiling is that); an unreadable one counts as empty."""
    try:
        fields = line.decode().split()
        numbers = [max(0, int(field)) for field in fields[:2]]
    except (UnicodeDecodeError, ValueError):
        return 0, 0, None
    highest = numbers[0] if numbers else 0
    ceiling = numbers[1] if len(numbers) > 1 else highest
    boot = fields[2] if len(fields) > 2 and fields[2] != "-" else None
    return highest, max(ceiling, highest), boot
