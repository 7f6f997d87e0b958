"""`python -m apps.node.parent_death PARENT_PID -- ARGV…`: exec ARGV so it dies with its parent.

The supervisor starts every child through this launcher. It asks the kernel to SIGKILL the
process when its parent dies (prctl PR_SET_PDEATHSIG, which survives the execve that
follows), then checks the parent is still the one that launched it (it may have died in the
instant before), then becomes ARGV. So a supervisor killed outright — by the OOM killer,
with SIGKILL — takes its children with it: none of them goes on serving QUIC or holding the
node's ports. (A `preexec_fn` would do the same inside subprocess, but it is unsafe in a
process that runs threads, as the supervisor does.) Celery's pool processes already die
with the Celery worker the same way. Linux only; elsewhere the launcher just execs.

Plain module: no Django, nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m apps.node.parent_death PARENT_PID -- ARGV...")
    parent, argv = int(args[0]), args[2:]
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the kernel was told to watch it
        sys.exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
