"""Lab 08 (the overlap loop): your loop on a recording stand-in for the scheduler's phases (every call
and the step it happens in are recorded, and the order is checked against the contract), on fixed and
random schedules; then the real engine running your loop (``components={"loop": "lab08"}``) on a tiny
model, against the plain loop. Run: ``python -m autograder lab08``.

The stand-in (``RecordingPhases``) plays a script: at each step ``schedule()`` returns a new batch (of
named requests, some of which its ``process`` finishes on EOS or at their length; some aborted between
steps) or None. Batch ``k`` is the ``k``-th batch scheduled (from 0); a step is one call of ``loop.step()``
(from 1). What the contract expects at step ``n``: launch the batch scheduled in step ``n`` (if any), then
wait for and process the batch launched in step ``n - 1`` (if any), return its tokens, and free every
finished request that the batch launched in step ``n`` does not contain (the others one step later).
Every ``free`` is checked at once against the batches launched and not yet processed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from autograder.adapters import lab08 as lab
from autograder.checks import first_token_difference
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.scheduler.events import TokenEvent


class Violation(AssertionError):
    """The loop called a phase with something it must never get (the message says what)."""


# ---- the recording stand-in for the scheduler's phases ------------------------------------------------------
@dataclass(eq=False)
class FakeReq:
    name: str
    finished: str | None = None  # "stop", "length" or "abort" once finished
    freed: bool = False

    @property
    def uid(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"request {self.name}"


@dataclass(eq=False)
class FakeBatch:
    index: int
    reqs: list[FakeReq] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"batch {self.index}"


@dataclass
class Plan:
    """One step of a script: the requests of the batch ``schedule()`` returns (space-separated names; ""
    for None), which of them ``process`` of that batch finishes on EOS or at their length, and the requests
    aborted just before the step (from outside, as a client that goes away)."""

    reqs: str = ""
    eos: str = ""
    length: str = ""
    abort: str = ""


@dataclass(eq=False)
class Info:  # what prepare() returns: launch() needs it
    batch: FakeBatch


@dataclass(eq=False)
class DeviceTokens:  # what launch() returns: on a GPU, ids still being computed
    batch: FakeBatch


@dataclass(eq=False)
class HostTokens:  # what to_host() returns first: the host copy process() reads
    batch: FakeBatch


@dataclass(eq=False)
class Ready:  # what to_host() returns second: what wait() blocks on
    batch: FakeBatch


def as_plan(entry, step: int) -> Plan:
    """``True``: a batch of two new requests (named after the step), ``False``/None: idle; or a ``Plan``."""
    if isinstance(entry, Plan):
        return entry
    return Plan(f"s{step}a s{step}b") if entry else Plan()


class RecordingPhases:
    """Plays a script (per step a ``Plan``, or ``True``: a new batch / ``False``: None; None once the script
    ends) and records every call as ``(step, phase, argument)``: the batch index (None for a
    ``schedule()`` that returned None), for ``wait`` the object it got, for ``process`` also its tokens, for
    ``free`` the request's name. ``free`` of a request that a launched, unprocessed batch contains raises."""

    def __init__(self, script):
        self.plans = [as_plan(e, n + 1) for n, e in enumerate(script)]
        self.step = 0  # set by ``play`` before each loop.step()
        self.calls: list[tuple[int, str, object]] = []
        self.batches: list[FakeBatch] = []
        self.handed: dict[int, tuple[HostTokens, Ready]] = {}  # to_host's answer, per batch
        self.events: dict[int, list[TokenEvent]] = {}  # what process() returned, per batch
        self.reqs: dict[str, FakeReq] = {}
        self.launched: set[int] = set()
        self.processed: set[int] = set()
        self.finished_at: dict[str, int] = {}  # name -> step in which it finished (process, or the abort)
        self.untaken: list[FakeReq] = []

    def plan(self, step: int) -> Plan:
        return self.plans[step - 1] if 0 < step <= len(self.plans) else Plan()

    def req(self, name: str) -> FakeReq:
        return self.reqs.setdefault(name, FakeReq(name))

    def begin(self, step: int) -> None:
        """Before step ``step``: its aborts."""
        self.step = step
        for name in self.plan(step).abort.split():
            r = self.req(name)
            if r.finished is None:
                r.finished = "abort"
                self.finished_at[name] = step
                self.untaken.append(r)

    def _record(self, phase: str, what) -> None:
        self.calls.append((self.step, phase, what))

    def schedule(self):
        plan = self.plan(self.step) if sum(p == "schedule" for s, p, _ in self.calls if s == self.step) == 0 else Plan()
        if not plan.reqs:
            self._record("schedule", None)
            return None
        batch = FakeBatch(len(self.batches), [self.req(n) for n in plan.reqs.split()])
        self.batches.append(batch)
        self._record("schedule", batch.index)
        return batch

    def prepare(self, batch):
        if not isinstance(batch, FakeBatch):
            raise Violation(
                f"prepare() was called with {batch!r}: schedule() returned None (nothing to run), and a step "
                "launches only a batch schedule() returned. Skip prepare/launch when it returns None, but still "
                "process the pending batch"
            )
        self._record("prepare", batch.index)
        return Info(batch)

    def launch(self, batch, info):
        if not isinstance(batch, FakeBatch):
            raise Violation(f"launch() was called with {batch!r} instead of a batch schedule() returned")
        if not isinstance(info, Info) or info.batch is not batch:
            raise Violation(f"launch({batch!r}, info) must get the info prepare({batch!r}) returned, got {info!r}")
        self._record("launch", batch.index)
        self.launched.add(batch.index)
        return DeviceTokens(batch)

    def to_host(self, tokens):
        if not isinstance(tokens, DeviceTokens):
            raise Violation(f"to_host() takes the tokens launch() returned, got {tokens!r}")
        self._record("to_host", tokens.batch.index)
        answer = (HostTokens(tokens.batch), Ready(tokens.batch))
        self.handed[tokens.batch.index] = answer
        return answer

    def wait(self, ready):
        self._record("wait", ready)

    def process(self, batch, tokens):
        if not isinstance(batch, FakeBatch):
            raise Violation(f"process() was called with {batch!r} instead of a launched batch")
        self._record("process", (batch.index, tokens))
        self.processed.add(batch.index)
        plan = self.plan(self.step_of(batch.index))
        events = []
        for r in batch.reqs:
            if r.finished is not None:  # rode along (or aborted): its token is dropped
                continue
            reason = "stop" if r.name in plan.eos.split() else "length" if r.name in plan.length.split() else None
            events.append(TokenEvent(uid=r.name, token_id=1000 + batch.index, finish_reason=reason))
            if reason is not None:
                r.finished = reason
                self.finished_at[r.name] = self.step
                self.untaken.append(r)
        self.events.setdefault(batch.index, events)
        return events

    def step_of(self, index: int) -> int:
        """The step whose plan made batch ``index``."""
        return next(s for s, p, what in self.calls if p == "schedule" and what == index)

    def take_finished(self):
        self._record("take_finished", [r.name for r in self.untaken])
        taken, self.untaken = self.untaken, []
        return taken

    def free(self, req):
        if not isinstance(req, FakeReq):
            raise Violation(f"free() takes a request that take_finished() returned, got {req!r}")
        if req.freed:
            raise Violation(
                f"free({req!r}) was called twice (again in step {self.step}): freed twice, its row and pages would "
                "go back to the pool twice (two requests would get them). Free each finished request once"
            )
        if req.finished is None:
            raise Violation(f"free({req!r}): the request has not finished; free only what take_finished() returned")
        for j in sorted(self.launched - self.processed):
            if req in self.batches[j].reqs:
                raise Violation(
                    f"free({req!r}) in step {self.step}: batch {j} (launched in step {self.step_of(j)}) contains it "
                    f"and is not processed yet: freed early, while a launched batch still reads its row and KV "
                    f"pages ({req!r} finished in step {self.finished_at[req.name]}, {req.finished}; it rides along "
                    f"in batch {j}). Hold it back and free it after batch {j} was processed"
                )
        req.freed = True
        self._record("free", req.name)


@dataclass
class Step:
    number: int  # from 1
    scheduled: int | None  # the batch schedule() returned in this step, or None
    calls: list[tuple[str, object]]  # (phase, argument) in call order
    returned: object
    in_flight: object = None  # after the step (only when asked for)

    def processed(self) -> list[int]:
        return [what[0] for phase, what in self.calls if phase == "process"]

    def index(self, phase: str, batch: int | None = None) -> int:
        """Position of the first call of ``phase`` (for ``batch``) in this step, or -1."""
        for i, (p, what) in enumerate(self.calls):
            if p == phase and (batch is None or what == batch or (isinstance(what, tuple) and what[0] == batch)):
                return i
        return -1


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    in_flight_before: object = None
    phases: RecordingPhases | None = None


def play(script, steps: int | None = None, in_flight: bool = False) -> Trace:
    """Your loop on ``RecordingPhases(script)`` for ``steps`` steps (default: the script, then 3 more)."""
    phases = RecordingPhases(script)
    loop = lab.make_loop(phases)
    trace = Trace(phases=phases)
    if in_flight:
        trace.in_flight_before = loop.in_flight
    for n in range(1, (steps or len(script) + 3) + 1):
        phases.begin(n)
        before = len(phases.batches)
        try:
            returned = loop.step()
        except Violation as e:
            raise Violation(f"step {n}: {e}") from None
        scheduled = before if len(phases.batches) > before else None
        calls = [(phase, what) for s, phase, what in phases.calls if s == n]
        trace.steps.append(Step(n, scheduled, calls, returned, loop.in_flight if in_flight else None))
    return trace


def launched_in(trace: Trace) -> dict[int, int]:
    """batch -> the step that scheduled it."""
    return {s.scheduled: s.number for s in trace.steps if s.scheduled is not None}


# ---- the checks (each names the pitfall it finds) ------------------------------------------------------------
def check_launches(trace: Trace) -> None:
    """A scheduled batch is prepared, launched and sent to_host in the step that scheduled it, in that order."""
    for s in trace.steps:
        count = [p for p, _ in s.calls].count("schedule")
        if count != 1:
            raise AssertionError(
                f"step {s.number} called schedule() {count} times: once per step (it plans one batch, or says None)"
            )
        if s.scheduled is None:
            continue
        b = s.scheduled
        where = [s.index(phase, b) for phase in ("prepare", "launch", "to_host")]
        for phase, i in zip(("prepare", "launch", "to_host"), where):
            if i < 0:
                raise AssertionError(
                    f"step {s.number}: schedule() returned batch {b}, but {phase}() was never called for it in "
                    "that step: a scheduled batch is prepared, launched and sent to_host in the step that planned it"
                )
        if not where[0] < where[1] < where[2]:
            raise AssertionError(
                f"step {s.number}: batch {b}'s calls came in the order {[p for p, _ in s.calls]}; expected "
                "prepare, launch, to_host"
            )


def check_processing(trace: Trace) -> None:
    """Each step processes exactly the batch launched in the previous step (if any), after launching its own."""
    born = launched_in(trace)
    done: dict[int, int] = {}  # batch -> step that processed it
    previous: int | None = None  # the batch launched in the previous step
    for s in trace.steps:
        got, b = s.processed(), s.scheduled
        want = [] if previous is None else [previous]
        for j in got:
            if j in done:
                raise AssertionError(
                    f"batch {j} was processed twice (in steps {done[j]} and {s.number}): a processed batch is no "
                    "longer pending (its requests' tokens would be handed out again, and in_flight never clears)"
                )
            done[j] = s.number
        if got == want and want:
            j = want[0]
            if s.index("process", j) < s.index("schedule"):
                raise AssertionError(
                    f"step {s.number}: batch {j} was processed before schedule() planned the next batch (calls: "
                    f"{[p for p, _ in s.calls]}): processed before schedule, the host processes while the device "
                    "has nothing queued. schedule() and launch the next batch first, then process the pending one"
                )
            if b is not None and s.index("process", j) < s.index("launch", b):
                raise AssertionError(
                    f"step {s.number}: batch {j} was processed before launch of batch {b}, scheduled in that step "
                    f"(calls: {[p for p, _ in s.calls]}): processed before launch, the device idles while the host "
                    f"processes, and a request that finished in batch {j} gives its memory back while batch {b}, "
                    "prepared with it, is not launched yet. Launch (and to_host) the new batch first"
                )
            copy = s.index("to_host", b) if b is not None else -1
            waited = s.index("wait")
            if copy >= 0 and (s.index("process", j) < copy or 0 <= waited < copy):
                raise AssertionError(
                    f"step {s.number}: batch {j} was waited for or processed before to_host of batch {b}, launched "
                    f"in that step (calls: {[p for p, _ in s.calls]}): the copy of batch {b}'s tokens to the host "
                    f"starts only after the host is done with batch {j}, so it overlaps nothing and the next step "
                    "waits for all of it. Start the new batch's copy (to_host) right after its launch, then wait for "
                    "and process the pending batch"
                )
        elif got != want:
            if b is not None and b in got:
                if want and want[0] not in got:
                    raise AssertionError(
                        f"step {s.number} processed batch {b}, launched in that very step, while batch {want[0]} "
                        f"(launched in step {born[want[0]]}) was still pending: the newest pending batch first. "
                        "Process in launch order: the batch launched in the previous step"
                    )
                raise AssertionError(
                    f"step {s.number} processed batch {b} in the same step that launched it: that is the plain loop "
                    "(the host waits for each batch, nothing overlaps). Keep it pending; process it in the next "
                    "step, after launching the next batch"
                )
            late = [j for j in got if born.get(j, s.number) < s.number - 1]
            if late:
                raise AssertionError(
                    f"step {s.number} processed batch {late[0]}, launched in step {born[late[0]]}: one step late "
                    f"(two batches pending). Expected {want[0] if want else 'no batch'}: a batch is processed in "
                    "the step after its launch"
                )
            if want and not got:
                if b is None:
                    raise AssertionError(
                        f"step {s.number}: schedule() returned None and batch {want[0]} (launched in step "
                        f"{born[want[0]]}) was not processed: drain the pending batch. When nothing new is "
                        "launched the last batch must still be processed, or its tokens never come out"
                    )
                raise AssertionError(
                    f"step {s.number} launched batch {b} but processed nothing while batch {want[0]} (launched in "
                    f"step {born[want[0]]}) was pending: one step late. Process the previous step's batch"
                )
            raise AssertionError(f"step {s.number} processed batches {got}, expected {want}")
        previous = b


def process_calls(trace: Trace):
    """(step, what the last wait() of that step before it got, or NO_WAIT, batch, tokens) per process() call."""
    for s in trace.steps:
        waited = NO_WAIT
        for phase, what in s.calls:
            if phase == "wait":
                waited = what
            elif phase == "process":
                yield s.number, waited, what[0], what[1]
                waited = NO_WAIT


NO_WAIT = object()


def check_waits(trace: Trace) -> None:
    """Each process(batch) comes after a wait() in the same step (since the previous process), on the ready
    that to_host() returned for that batch."""
    calls = list(process_calls(trace))
    if not calls:
        raise AssertionError("no batch was processed at all (see the other tests)")
    for step, waited, j, _ in calls:
        if waited is NO_WAIT:
            raise AssertionError(
                f"step {step}: batch {j} was processed without waiting for its copy to the host (no "
                "sched.wait(ready) before process): on a GPU its tokens may not have landed yet. wait() on the "
                "ready that to_host() returned for it, then process"
            )
        want = trace.phases.handed[j][1]
        if waited is not want:
            raise AssertionError(
                f"step {step}: the wait() before process(batch {j}) got {waited!r}, expected {want!r}, the ready that "
                f"to_host() returned for batch {j}: waiting on another batch's copy (the one just launched) lets "
                "process read a copy that has not landed on a GPU, and waits longer than it must. Keep each batch's "
                "ready with it while it is pending"
            )


def check_host_tokens(trace: Trace) -> None:
    """Each process(batch, tokens) gets the host tokens that to_host() returned for that batch."""
    calls = list(process_calls(trace))
    if not calls:
        raise AssertionError("no batch was processed at all (see the other tests)")
    for step, _, j, tokens in calls:
        want = trace.phases.handed[j][0]
        if tokens is not want:
            kind = "launch()'s device tokens" if isinstance(tokens, DeviceTokens) else repr(tokens)
            raise AssertionError(
                f"step {step}: process(batch {j}, tokens) got {kind} ({tokens!r}), expected {want!r}, the host copy "
                f"that to_host() returned for batch {j}: keep to_host's first result pending, not launch's device "
                "tensor (on a GPU, reading that on the host waits for the device: one sync per step, and nothing "
                "overlaps)"
            )


def check_returns(trace: Trace) -> None:
    """A step returns the tokens of the batch it processed ([] when none)."""
    for s in trace.steps:
        want = [e for j in s.processed() for e in trace.phases.events[j]]
        if not isinstance(s.returned, list) or s.returned != want:
            what = f"process() of batch {s.processed()[0]} in that step returned" if want else "nothing was processed:"
            # the hint first, the events short (uid:token): the report cuts a line past 300 characters
            raise AssertionError(
                "return the tokens of the batch processed in this step (also when draining, after schedule() "
                f"returned None), [] when none: step {s.number} returned {_short(s.returned)}, but {what} "
                f"{_short(want)}"
            )


def _short(events) -> str:
    """``[s1a:1000, s1b:1000]`` for a list of token events; anything else as its repr."""
    if not isinstance(events, list) or not all(hasattr(e, "uid") and hasattr(e, "token_id") for e in events):
        return repr(events)
    return "[" + ", ".join(f"{e.uid}:{e.token_id}" for e in events) + "]"


def check_in_flight(trace: Trace) -> None:
    if trace.in_flight_before is not False:
        raise AssertionError(f"in_flight was {trace.in_flight_before!r} before any step, expected False")
    for s in trace.steps:
        want = s.scheduled is not None
        if s.in_flight is not want:
            state = f"batch {s.scheduled} was launched and not processed" if want else "no batch is pending"
            raise AssertionError(
                f"in_flight was {s.in_flight!r} after step {s.number}, expected {want} ({state}): in_flight is True "
                "exactly while a launched batch waits to be processed (the scheduler keeps stepping while it is)"
            )


def check_frees(trace: Trace) -> None:
    """Each finished request is freed once, in the first step after which no launched, unprocessed batch
    contains it (an early free raises in ``RecordingPhases.free``)."""
    ph = trace.phases
    frees: dict[str, list[int]] = {}
    for s in trace.steps:
        for phase, what in s.calls:
            if phase == "free":
                frees.setdefault(what, []).append(s.number)
    launched_at = {s.number: ph.batches[s.scheduled] for s in trace.steps if s.scheduled is not None}
    for name, n0 in sorted(ph.finished_at.items(), key=lambda kv: kv[1]):
        r, batch = ph.reqs[name], launched_at.get(n0)
        rides = batch is not None and r in batch.reqs
        want = n0 + 1 if rides else n0
        why = (
            f"batch {batch.index}, launched in step {n0}, contains it: free it after that batch is processed"
            if rides
            else f"no batch launched in step {n0} contains it"
        )
        got = frees.get(name, [])
        drain = "" if want in launched_at else " (nothing new was launched then: still free the held requests)"
        if not got:
            raise AssertionError(
                f"{r!r} finished in step {n0} ({r.finished}) and was never freed: its row and KV pages never come "
                f"back. Expected free() in step {want}{drain}: {why}. Free every request take_finished() returns"
            )
        if got[0] > want:
            raise AssertionError(
                f"{r!r} finished in step {n0} ({r.finished}) and was freed in step {got[0]}, expected step {want}"
                f"{drain} ({why}): freed a step late, its memory held while nothing reads it (waiting requests "
                "stay out). Check each finished request against the batch in flight, not the group at once, and call "
                "take_finished() after the step's process()"
            )


# ---- fixed schedules ----------------------------------------------------------------------------------------
@points(4)
def test_first_step_launches_and_keeps_it_pending():
    """Step 1 plans, prepares, launches and sends to_host batch 0, and processes nothing: returns []."""
    trace = play([True], steps=1)
    check_launches(trace)
    check_processing(trace)
    check_returns(trace)


@points(10)
def test_launches_the_next_batch_before_processing():
    """Step 2 launches batch 1 (schedule, prepare, launch, to_host), then processes batch 0."""
    trace = play([True, True], steps=2)
    check_launches(trace)
    check_processing(trace)


@points(4)
def test_waits_before_processing():
    """Every process(batch) comes after a wait() for that batch's host copy, in the same step."""
    check_waits(play([True, True, False], steps=3))


@points(3)
def test_process_reads_the_host_copy():
    """process(batch, tokens) reads the host copy that to_host() returned for that batch."""
    check_host_tokens(play([True, True, False], steps=3))


@points(8)
def test_drains_the_last_batch():
    """When schedule() returns None the pending batch is still processed, its tokens returned; then nothing."""
    trace = play([True, False, False], steps=3)
    check_launches(trace)
    check_processing(trace)
    check_returns(trace)


@points(4)
def test_in_flight():
    """in_flight is True exactly while a launched batch is not processed yet."""
    check_in_flight(play([True, True, False, False], steps=4, in_flight=True))


@points(6)
def test_processes_each_batch_once_in_launch_order():
    """Over a longer schedule with idle steps, each batch is processed once, in launch order, one step late."""
    trace = play([True, True, False, True, True, True, False, False, True, False], steps=12)
    check_processing(trace)
    check_returns(trace)


RIDES_ALONG = [
    Plan("a b", eos="a"),  # batch 0: a samples EOS (process finds out in step 2)
    Plan("a b"),  # batch 1, planned before batch 0 was processed: a rides along
    Plan("b", length="b"),  # batch 2: b reaches its length
    Plan(),
]

EOS_AND_LENGTH = [
    Plan("a b c", eos="a", length="b"),  # batch 0: a stops on EOS, b at its length (known when batch 1 is planned)
    Plan("a c"),  # batch 1: a rides along, b is not in it
    Plan("c", length="c"),
    Plan(),
]

DRAIN_AND_ABORT = [
    Plan("a b", eos="a"),
    Plan(),  # idle: batch 0 is drained, nothing launched
    Plan("b"),
    Plan("c", abort="b"),  # b aborted while batch 1 (with it) is pending
    Plan("", length=""),
]


@points(10)
def test_frees_a_request_only_after_its_last_batch():
    """A request that finished on EOS in batch 0 rides along in batch 1: freed after batch 1 is processed."""
    check_frees(play(RIDES_ALONG))


@points(6)
def test_frees_each_request_as_soon_as_no_batch_reads_it():
    """Two requests finish in one batch: the one riding along in the next batch waits, the other (length) is
    freed at once."""
    check_frees(play(EOS_AND_LENGTH))


@points(6)
def test_frees_at_the_drain_and_after_an_abort():
    """Finished when nothing new is launched: freed in that step; aborted while in the pending batch: freed
    after that batch is processed."""
    trace = play(DRAIN_AND_ABORT)
    check_processing(trace)
    check_frees(trace)


# ---- random schedules -----------------------------------------------------------------------------------------
def random_plans(shape: list[bool], rng: random.Random) -> list[Plan]:
    """A script as the scheduler would play it: per step a batch (``True``) of the running requests and up to
    two new ones, or None; some finish on EOS (and ride along in the next batch when one is planned in the
    very next step), some at their length (known before the next batch is planned), one now and then aborted."""
    plans, running, riders, count = [], [], [], 0
    for has_batch in shape:
        abort = [r for r in running if r not in riders and rng.random() < 0.1][:1]
        running = [r for r in running if r not in abort]
        eos, length = [], []
        if has_batch:
            for _ in range(rng.randint(0 if running else 1, 2)):
                running.append(f"r{count}")
                count += 1
            reqs = list(running)
            for r in reqs:
                if r not in riders:
                    x = rng.random()
                    (eos if x < 0.25 else length if x < 0.4 else []).append(r)
            plans.append(Plan(" ".join(reqs), " ".join(eos), " ".join(length), " ".join(abort)))
        else:
            plans.append(Plan(abort=" ".join(abort)))
        running = [r for r in running if r not in riders and r not in length]  # the previous batch is processed
        riders = eos
    return plans


def show_plans(plans: list[Plan]) -> str:
    out = []
    for n, p in enumerate(plans, 1):
        bits = [f"batch [{p.reqs}]" if p.reqs else "None"]
        bits += [f"{k}: {v}" for k, v in (("EOS", p.eos), ("length", p.length), ("aborted before", p.abort)) if v]
        out.append(f"step {n}: " + ", ".join(bits))
    return "\n".join(out)


def check_script(script) -> None:
    """Every rule on one schedule (the script, then 3 idle steps)."""
    try:
        trace = play(script, in_flight=True)
        check_launches(trace)
        check_processing(trace)
        if any(bool(as_plan(e, 1).reqs) for e in script):
            check_waits(trace)
            check_host_tokens(trace)
        check_returns(trace)
        check_in_flight(trace)
        check_frees(trace)
    except AssertionError as e:
        plans = [as_plan(e, n + 1) for n, e in enumerate(script)]
        raise AssertionError(f"{e}\nthe schedule:\n{show_plans(plans)}") from None


@points(10, timeout=90)
def test_random_schedules():
    """Random schedules (batches, idle steps, EOS and length finishes, aborts): every rule above, at every step."""
    check_script([True, True, False, True])
    check_script(RIDES_ALONG)
    _random_schedules()


@settings(max_examples=60, phases=[Phase.explicit, Phase.generate])
@given(shape=st.lists(st.booleans(), min_size=1, max_size=14), seed=st.integers(0, 2**16))
def _random_schedules(shape, seed):
    check_script(random_plans(shape, random.Random(seed)))


# ---- the engine on your loop ----------------------------------------------------------------------------------
@dataclass
class Request:
    arrival: int  # the step before which it is added
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool


def workload(vocab: int, seed: int = 8) -> list[Request]:
    """Ten requests: four at the start, the others arriving mid-run; prompts long enough to be cut in
    chunks (a 16-token budget); half stop on EOS."""
    rng = random.Random(seed)
    out = []
    for i in range(10):
        arrival = 0 if i < 4 else rng.randint(2, 14)
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 30))]
        out.append(Request(arrival, prompt, rng.randint(3, 14), ignore_eos=i % 2 == 0))
    return out


class WatchedPhases:
    """The scheduler, seen by the loop under test: every phase goes through; each launch checks that every
    request of the batch still holds its memory (a freed request's ``Req.table_idx`` is -1), and each
    ``free`` that no launched, unprocessed batch contains the request. Records (step, phase, batch)."""

    def __init__(self, sched, log: list, problems: list):
        self._sched, self.log, self.problems = sched, log, problems
        self.step = 0
        self.numbers: dict = {}  # batch -> its number, in scheduling order (keeps every batch alive)
        self.in_flight: dict = {}  # number -> batch, launched and not processed

    def __getattr__(self, name):
        return getattr(self._sched, name)

    def _number(self, batch) -> int:
        return self.numbers.setdefault(batch, len(self.numbers))

    def schedule(self):
        batch = self._sched.schedule()
        self.log.append((self.step, "schedule", None if batch is None else self._number(batch)))
        return batch

    def prepare(self, batch):
        return self._sched.prepare(batch)

    def launch(self, batch, info):
        n = self._number(batch)
        for req in batch.reqs:
            if req.table_idx < 0 and not self.problems:
                self.problems.append(
                    f"step {self.step}: request {req.uid} in batch {n} gave its table row and KV pages back "
                    f"(finished: {req.finish_reason}) before batch {n}, which computes it, was launched: a slot freed "
                    "while still in use. The previous batch was processed before launch of this one: launch first, "
                    "then process"
                )
        self.log.append((self.step, "launch", n))
        self.in_flight[n] = batch
        return self._sched.launch(batch, info)

    def to_host(self, tokens):
        return self._sched.to_host(tokens)

    def wait(self, ready):
        return self._sched.wait(ready)

    def process(self, batch, tokens):
        self.log.append((self.step, "process", self._number(batch)))
        self.in_flight.pop(self._number(batch), None)
        return self._sched.process(batch, tokens)

    def take_finished(self):
        return self._sched.take_finished()

    def free(self, req):
        for n, batch in self.in_flight.items():
            if any(r is req for r in batch.reqs) and not self.problems:
                self.problems.append(
                    f"step {self.step}: free(request {req.uid}) while batch {n}, launched and not processed yet, "
                    "contains it: freed early (the request rode along in the batch just launched; its row and KV "
                    "pages may go to the next request admitted while that batch reads them). Keep it and free it "
                    "after that batch is processed"
                )
        self.log.append((self.step, "free", req.uid))
        return self._sched.free(req)


@dataclass
class EngineRun:
    outputs: dict[int, tuple[list[int], str | None]]
    log: list  # (step, phase, batch number)
    problems: list[str]
    steps: int


def run_engine(model, loop, reqs: list[Request], eos: list[int], page_size: int = 1, abort=None) -> EngineRun:
    """The engine with ``loop`` (a SchedulerLoop class) driving a watched scheduler, stepped by hand:
    requests are added at their arrival step; ``abort``: (step, request) aborted before that step; at most
    a few hundred steps."""
    from minisgl import LLM, SamplingParams

    log: list = []
    problems: list[str] = []
    watched: list[WatchedPhases] = []

    def factory(sched):
        watched.append(WatchedPhases(sched, log, problems))
        return loop(watched[-1])

    with lab.registered_loop(factory, "lab08-graded") as name:
        llm = LLM(
            str(model),
            device="cpu",
            dtype="float32",
            attention_backend="torch",
            page_size=page_size,
            max_prefill_length=16,
            max_running_requests=4,
            debug_checks=True,
            components={"loop": name},
        )
    try:
        sched = llm.scheduler
        sched.add_eos_ids(eos)
        out: dict[int, tuple[list[int], str | None]] = {}
        todo = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
        step, limit = 0, 60 + 4 * sum(len(r.prompt) + r.max_tokens for r in reqs)
        while todo or sched.has_work:
            while todo and reqs[todo[0]].arrival <= step:
                i = todo.pop(0)
                r = reqs[i]
                sched.add_request(i, r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos))
                out[i] = ([], None)
            if step >= limit:
                unfinished = sorted(i for i, (_, reason) in out.items() if reason is None)
                raise AssertionError(
                    f"after {step} steps the scheduler still has work (requests {unfinished} have no last token, "
                    f"in_flight={sched.loop.in_flight}): the last batch is never drained, or its tokens were dropped"
                )
            step += 1
            watched[0].step = step
            if abort is not None and abort[0] == step:
                sched.abort(abort[1])
            for ev in sched.step():
                tokens, _ = out[ev.uid]
                tokens.append(ev.token_id)
                out[ev.uid] = (tokens, ev.finish_reason)
        return EngineRun(out, log, problems, step)
    finally:
        llm.shutdown()


def stop_tokens(model, reqs: list[Request]) -> list[int]:
    """For each request that stops on EOS, a token of its answer (the 2nd, 3rd or 4th) made an EOS id: those
    requests stop early, at different steps (as may others that sample one of these tokens)."""
    from minisgl.scheduler import PlainLoop

    run = run_engine(model, PlainLoop, reqs, [])
    answers = [(run.outputs[i][0], i) for i, r in enumerate(reqs) if not r.ignore_eos]
    return sorted({tokens[min(1 + i % 3, len(tokens) - 1)] for tokens, i in answers})


def prepared(model):
    """(your loop class, the workload, its EOS ids); a stub fails here, before any engine runs."""
    from minisgl.models.config import ModelConfig

    cls = lab.loop_class()
    smoke = cls(RecordingPhases(RIDES_ALONG))
    for _ in range(len(RIDES_ALONG)):
        smoke.step()
    assert isinstance(smoke.in_flight, bool), "in_flight must be a bool"
    reqs = workload(ModelConfig.from_path(model).vocab_size)
    return cls, reqs, stop_tokens(model, reqs)


def engine_runs(model, page_size: int = 1) -> tuple[EngineRun, EngineRun]:
    """(yours, the plain loop's) on the same workload, with tokens of the answers made EOS (``stop_tokens``)."""
    from minisgl.scheduler import PlainLoop

    cls, reqs, eos = prepared(model)
    with engine_failure("your loop"):
        got = run_engine(model, cls, reqs, eos, page_size)
    return got, run_engine(model, PlainLoop, reqs, eos, page_size)


@points(10, timeout=180)
@engine
def test_engine_tokens_equal_the_plain_loop(tiny_llama):
    """The engine on your loop (requests arriving mid-run, chunked prompts, EOS and length finishes at
    different steps) hands out exactly the plain loop's tokens and finish reasons, at page sizes 1 and 4."""
    for page_size in (1, 4):
        got, want = engine_runs(tiny_llama, page_size)
        reasons = {reason for _, reason in want.outputs.values()}
        assert reasons == {"stop", "length"}, f"the grader's workload should finish both ways: {reasons}"
        ids = sorted(want.outputs)
        diff = first_token_difference([got.outputs[i][0] for i in ids], [want.outputs[i][0] for i in ids])
        assert diff is None, (
            f"page_size {page_size}: with your loop the engine handed out other tokens than with the plain loop: "
            f"{diff}. Usual causes: a batch processed twice or out of launch order, or a drained batch's tokens "
            "not returned"
        )
        for i in ids:
            assert got.outputs[i][1] == want.outputs[i][1], (
                f"page_size {page_size}: request {i} finished with {got.outputs[i][1]!r}, expected "
                f"{want.outputs[i][1]!r}"
            )


@points(5, timeout=120)
@engine
def test_engine_frees_no_memory_in_use(tiny_llama):
    """In the engine (one request aborted mid-run), no request is freed while a launched, unprocessed batch
    contains it, none is freed before a batch that computes it is launched, and every request is freed once."""
    cls, reqs, eos = prepared(tiny_llama)
    victim = max((i for i, r in enumerate(reqs) if r.arrival == 0 and r.ignore_eos), key=lambda i: reqs[i].max_tokens)
    with engine_failure("your loop"):
        got = run_engine(tiny_llama, cls, reqs, eos, abort=(4, victim))
    assert not got.problems, got.problems[0]
    freed = sorted(uid for _, phase, uid in got.log if phase == "free")
    assert freed == list(range(len(reqs))), (
        f"free() was called for requests {freed}, expected each of {list(range(len(reqs)))} once: every request "
        "take_finished() returns is freed once (never freed: its memory never comes back; twice: two requests "
        "would get it)"
    )


@points(4, timeout=120)
@engine
def test_engine_one_step_behind(tiny_llama):
    """In the engine, each step launches its batch first, then processes the batch launched in the
    previous step: one step behind, never in the same step, never later."""
    got, _ = engine_runs(tiny_llama)
    launched = {n: step for step, phase, n in got.log if phase == "launch"}
    for step in range(1, got.steps + 1):
        calls = [(phase, n) for s, phase, n in got.log if s == step]
        processed = [n for phase, n in calls if phase == "process"]
        want = [n for n, s in launched.items() if s == step - 1]
        if processed != want:
            when = [f"batch {n} (launched in step {launched.get(n)})" for n in processed] or ["nothing"]
            hint = ""
            if any(launched.get(n) == step for n in processed):
                hint = ": processed in the same step it was launched (the plain loop)"
            elif any(launched.get(n, step) < step - 1 for n in processed) or (want and not processed):
                hint = ": one step late"
            raise AssertionError(
                f"step {step} processed {', '.join(when)}; expected {f'batch {want[0]}' if want else 'nothing'} "
                f"(launched in the previous step){hint}"
            )
        mine = [n for phase, n in calls if phase == "launch"]
        if mine and processed and calls.index(("process", processed[0])) < calls.index(("launch", mine[0])):
            raise AssertionError(
                f"step {step} processed batch {processed[0]} before launching batch {mine[0]}: the host's work "
                "does not overlap the device's. Launch first, then process"
            )
