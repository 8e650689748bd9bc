"""What one rank's phase leaves beside the timed loop, shared by the run package (the
restore's pattern and checks, the save's pattern, the layouts that gather them, the torch
exchange that stamps into the same log): its samples (Log), what it saw beyond them
(PhaseOutcome, its messages kept up to MAX_MESSAGES), and a failed call's OSError in words
(describe). Nothing here times anything."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

MAX_MESSAGES = 10   # error messages kept per rank and phase
# A rank's samples, in order: (iteration, op code, start ns, stop ns, bytes, ok)
Log = list[tuple[int, int, int, int, int, int]]


@dataclass
class PhaseOutcome:
    """What one rank saw in one phase, beyond its samples."""

    errors: int = 0
    ops: int = 0                    # storage ops this phase issued, failed ones included
    timed_out: bool = False
    incomplete: bool = False        # the rank does not hold all its bytes
    corrupt: bool = False           # bytes read differ from the checkpoint (or are not finite)
    messages: list[str] = field(default_factory=list)
    digests: list[dict[str, object]] = field(default_factory=list)   # record_digests: per extent

    def fail(self, text: str) -> None:
        self.errors += 1
        self.say(text)

    def say(self, text: str) -> None:
        """An error message with no failed op of its own (an op never issued because an
        earlier one failed): `errors` counts ops, never more than `ops` holds."""
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(text)


def describe(error: OSError, direct: bool, follow_links: bool = True) -> str:
    """A failed storage call's error as a phase's message says it: the errno's text, with
    what O_DIRECT's EINVAL and a refused link (follow_links False: ELOOP) mean here."""
    if error.errno == errno.ELOOP and not follow_links:
        return "a symbolic link, not the file prepare wrote (refused, as a missing file is)"
    text = os.strerror(error.errno) if error.errno else str(error)
    if error.errno and error.strerror and error.strerror != text:   # a backend's own words
        # (S3's status and code, libnfs's, libcephfs's): kept, once where they repeat it
        text = error.strerror if error.strerror.startswith(text) else f"{text}: {error.strerror}"
    if direct and error.errno == errno.EINVAL:
        text += " (O_DIRECT refused: the file system may not support it)"
    return text
