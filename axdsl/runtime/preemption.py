"""One trainer per run directory (RUN_DIR/lock), and the signals (SIGTERM, SIGINT, SIGHUP) that
make a run save a checkpoint and stop cleanly.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import atexit
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from axdsl.runtime.processes import is_lead


class RunLock:
    """RUN_DIR/lock: one trainer per run directory. A JSON file with the holder's pid, host and
    start.

    Created with O_EXCL before anything else is written to the directory; a second trainer is
    refused (exit 1) with a message naming the first. A lock whose pid is dead on this host is
    stale (a SIGKILL, a crash): it is taken over with a one-line note. Released on exit.
    """

    def __init__(self, run_dir: Path):
        self.path = run_dir / "lock"
        self.held = False

    def acquire(self) -> None:
        """Take the lock or exit with an error naming its holder."""
        for _ in range(10):  # another trainer may take over the same stale lock at the same time
            if self._create():
                atexit.register(self.release)
                return
            holder = self._read()
            if holder is not None and not self._stale(holder):
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
                sys.exit(
                    f"error: {self.path.parent} is in use by pid {holder.get('pid')} on "
                    f"{holder.get('host')} since {since} ({self.path}): one trainer per run "
                    "directory; use another --out, or delete the lock if that process is gone"
                )
            self._take_over(holder)
        sys.exit(f"error: could not take {self.path}: other trainers keep taking it")

    def _create(self) -> bool:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record) + "\n")
        self.held = True
        return True

    def _read(self) -> dict | None:
        """The holder's record; None when the file is gone, empty or damaged (a writer cut
        short)."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    @staticmethod
    def _stale(holder: dict) -> bool:
        """Whether the holder is a dead process on this host (another host's lock is never
        stale)."""
        if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False

    def _take_over(self, holder: dict | None) -> None:
        """Move a stale (or unreadable) lock aside; only one trainer's rename succeeds."""
        aside = self.path.with_name(f"lock.stale.{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        aside.unlink(missing_ok=True)
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}"
            if holder
            else "an unreadable lock file"
        )
        print(f"taking over the stale lock of {who} in {self.path.parent}", file=sys.stderr)

    def release(self) -> None:
        """Remove the lock if this process holds it (idempotent; also run at exit)."""
        if self.held:
            self.held = False
            self.path.unlink(missing_ok=True)


class Preemption:
    """SIGTERM, SIGINT and SIGHUP (a dropped ssh session), turned into a save at the next call
    boundary and a clean exit.

    `runtime.Preemption()` installs the handlers (first thing in main, so that a Ctrl-C while
    loading data or compiling is caught too) and leaving `with preempt:` restores the previous
    ones. A signal only sets `preempt.signum`, so compilation and the calls in flight finish (the
    loop looks between calls, after dispatching the next one: up to two calls of up to
    tc.steps_per_call steps each). The loop then logs the last call's metrics, saves a checkpoint
    of its last step and calls `preempt.exit(...)`, which waits for the save, prints one line and
    exits 128 + signal (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP), with no traceback.
    Further signals are noted and ignored: the save is never cut short by them.
    With several processes every process stops at the same step: `requested` agrees across them.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self):
        self.signum = 0
        self.armed = False  # arm(): from then on a signal saves; before, there is nothing to save
        # a signal already ignored stays ignored: under `nohup` a hang-up must not stop the run
        ignored = {s for s in self.SIGNALS if signal.getsignal(s) is signal.SIG_IGN}
        self.previous = {
            s: signal.signal(s, self._handle) for s in self.SIGNALS if s not in ignored
        }

    def __enter__(self) -> "Preemption":
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def arm(self) -> None:
        """From now on a signal is a save at the next call boundary. Before (reading and
        tokenizing data, training a BPE), nothing is saved: a signal exits at once."""
        self.armed = True

    def _handle(self, signum: int, frame) -> None:
        if not self.armed:
            name = signal.Signals(signum).name
            print(f"train.py: {name} before training began; nothing to save", file=sys.stderr)
            raise SystemExit(128 + signum)
        if self.signum:
            print(
                f"{signal.Signals(signum).name} again: still saving, exiting when it is done",
                file=sys.stderr,
                flush=True,
            )
            return
        self.signum = signum

    @property
    def requested(self) -> bool:
        """Whether to stop at this call boundary (on every process alike: a collective when >1)."""
        if jax.process_count() == 1:
            return bool(self.signum)
        from jax.experimental import multihost_utils

        return bool(np.max(multihost_utils.process_allgather(np.int32(self.signum))))

    def exit(self, manager: ocp.CheckpointManager, log, step: int, run_dir: Path, tc) -> None:
        """After the checkpoint of step `step` was started (its metrics logged): finish, exit."""
        manager.wait_until_finished()
        manager.close()
        log.close(summary=False)
        signum = self.signum or signal.SIGTERM  # another process got the signal
        if is_lead():
            print(
                f"train.py: {signal.Signals(signum).name} at step {step}: "
                f"saved checkpoint {step} in {run_dir / tc.checkpoint_dir}; "
                "rerun the same command to resume",
                file=sys.stderr,
                flush=True,
            )
        raise SystemExit(128 + signum)
