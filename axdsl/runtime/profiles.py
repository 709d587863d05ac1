"""`--profile`: a window of steps traced with jax.profiler into RUN_DIR.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import argparse
import re
import sys
from pathlib import Path

import jax

from axdsl.runtime.processes import is_lead


def profile_window(value: str | None, tc) -> tuple[int, int] | None:
    """--profile START:STOP as (START, STOP), the steps START..STOP-1 of a run of tc.steps steps;
    None without the flag. A value that is not such a window exits with a one-line error."""
    if value is None:
        return None
    found = re.fullmatch(r"(\d+):(\d+)", value.strip(), re.ASCII)
    if not found or int(found[1]) >= int(found[2]):
        sys.exit(
            f"error: --profile {value!r}: give START:STOP, the steps START..STOP-1 to trace, "
            f"with 0 <= START < STOP (for example 10:15)"
        )
    if int(found[2]) > tc.steps:
        sys.exit(
            f"error: --profile {value}: the run ends at step {tc.steps}, "
            f"so STOP is at most {tc.steps}"
        )
    return int(found[1]), int(found[2])


class Profile:
    """`--profile START:STOP`: a jax.profiler trace of train steps START..STOP-1 in RUN_DIR/profile
    (plugins/profile/<time>/<host>.xplane.pb), for TensorBoard's profile plugin or XProf, and the
    same trace as perfetto_trace.json.gz beside it: ui.perfetto.dev opens it, and axdsl's
    benchmarks/trace_report.py sums it per HLO category and per line of the generated model.

    The loop's calls end at START and STOP too (`steps_in_call(tc, step, profile.bounds)`), so the
    traced calls run exactly those steps: the trace starts once the state before step START is
    ready and stops once step STOP-1's is. A run resumed inside the window traces from the step it
    resumes at; one resumed past it traces nothing. Only process 0 writes a trace (MaxText's default
    too): it shows that process's devices. As a context manager it stops a trace still running when
    the loop ends early (preemption, an error), so what was traced is written.
    """

    def __init__(self, args: argparse.Namespace, tc):
        self.window = profile_window(args.profile, tc)
        self.dir = Path(args.out) / "profile"
        self.active = self.done = False

    @property
    def bounds(self) -> tuple[int, ...]:
        """The steps that end a call: START and STOP, or none without --profile."""
        return self.window or ()

    def before(self, step: int, state) -> None:
        """Before the call from `step`: start the trace if `step` is in the window."""
        if (
            not self.window
            or self.active
            or self.done
            or not self.window[0] <= step < self.window[1]
        ):
            return
        jax.block_until_ready(state)  # the calls before the window are done: none of them is traced
        if is_lead():
            jax.profiler.start_trace(str(self.dir), create_perfetto_trace=True)
        self.active = True

    def after(self, step: int, results) -> None:
        """After the call that ends before `step`: stop once step STOP-1's `results` are ready."""
        if self.active and self.window and step >= self.window[1]:
            jax.block_until_ready(results)
            self.stop(f"steps {self.window[0]}..{self.window[1] - 1}")

    def stop(self, what: str) -> None:
        """Stop the trace and write it (process 0), saying what it holds and where."""
        self.active, self.done = False, True
        if is_lead():
            jax.profiler.stop_trace()
            print(
                f"profile of {what} in {self.dir} (open it with `tensorboard --logdir {self.dir}` "
                f"or xprof; its perfetto_trace.json.gz with ui.perfetto.dev)",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> "Profile":
        return self

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        try:
            self.stop(
                "the steps run before the loop ended inside the window"
            )  # keep what was traced
        except Exception as error:  # never hide the exit that brought us here
            print(f"warning: stopping the profile failed: {error}", file=sys.stderr)
