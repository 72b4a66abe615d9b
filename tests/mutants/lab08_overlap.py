"""Broken variants of solutions/lab08_overlap.py: one per pitfall its docstring names (the early free:
``frees_the_rider``), one of each kind of ``mutants.KINDS`` that can occur here, a correct one written another
way (``EQUIVALENT``: a queue of pending batches), and two that the hidden tests catch (``HIDDEN_MUTANTS``:
waiting on the wrong batch's copy, processing the device tensor; harmless in the engine on a CPU, they once
lost only hidden points: the recording stand-in of the visible tests now tells them apart too,
``visible_on_cpu`` below)."""

from mutants import Mutant

STEM = "lab08_overlap"

# every fixed test -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_schedules"
    for name in (
        "first_step_launches_and_keeps_it_pending",
        "launches_the_next_batch_before_processing",
        "waits_before_processing",
        "process_reads_the_host_copy",
        "drains_the_last_batch",
        "in_flight",
        "processes_each_batch_once_in_launch_order",
        "frees_a_request_only_after_its_last_batch",
        "frees_each_request_as_soon_as_no_batch_reads_it",
        "frees_at_the_drain_and_after_an_abort",
    )
}

_BODY = (
    "        s = self.sched\n"
    "        batch = s.schedule()\n"
    "        launched = None\n"
    "        if batch is not None:\n"
    "            device_tokens = s.launch(batch, s.prepare(batch))\n"
    "            host_tokens, ready = s.to_host(device_tokens)\n"
    "            launched = (batch, host_tokens, ready)\n"
    "        events: list[TokenEvent] = []\n"
    "        if self.pending is not None:\n"
    "            previous, previous_tokens, previous_ready = self.pending\n"
    "            s.wait(previous_ready)\n"
    "            events = s.process(previous, previous_tokens)\n"
    "        self.free_finished(batch)\n"
    "        self.pending = launched\n"
    "        return events\n"
)

_PROCESS_PENDING = (
    "        if self.pending is not None:\n"
    "            previous, previous_tokens, previous_ready = self.pending\n"
    "            s.wait(previous_ready)\n"
    "            events = s.process(previous, previous_tokens)\n"
)

NOT_APPLICABLE = {
    "boundary": "the contract states no comparison of numbers: the loop's only conditions are whether schedule() "
    "returned a batch and whether one is pending (None or not), with no threshold a case could land on",
    "one_argument": "the loop validates none of its inputs: the phases' results are passed on, never checked, so "
    "there is no input check that could look at one argument only",
}

_WAIT = "            s.wait(previous_ready)\n"
_KEEP = "            launched = (batch, host_tokens, ready)\n"
_CLASS = "class OverlapLoop(SchedulerLoop):\n"
_IMPORT = "from minisgl.scheduler.loop import Phases, SchedulerLoop\n"

MUTANTS = [
    Mutant(
        "copies_after_processing",
        STEM,
        (
            (
                "            device_tokens = s.launch(batch, s.prepare(batch))\n"
                "            host_tokens, ready = s.to_host(device_tokens)\n"
                "            launched = (batch, host_tokens, ready)\n",
                "            device_tokens = s.launch(batch, s.prepare(batch))\n",
            ),
            (
                "        self.pending = launched\n        return events\n",
                "        if batch is not None:\n"
                "            host_tokens, ready = s.to_host(device_tokens)\n"
                "            launched = (batch, host_tokens, ready)\n"
                "        self.free_finished(batch)\n"
                "        self.pending = launched\n"
                "        return events\n",
            ),
        ),
        must_fail=("launches_the_next_batch_before_processing", "random_schedules"),
        hint="before to_host of batch",
        why="the new batch's copy to the host starts after the previous batch was processed: the copy overlaps "
        "nothing, and the next step waits for all of it",
        kind="order",
    ),
    Mutant(
        "derives_from_the_engine",
        STEM,
        (
            (_IMPORT, "from minisgl.scheduler.loops import OverlapLoop as _EngineLoop\n" + _IMPORT),
            (_CLASS, "class OverlapLoop(_EngineLoop):\n    pass\n\n\nclass _Unused(SchedulerLoop):\n"),
        ),
        must_fail=("first_step_launches_and_keeps_it_pending", "random_schedules"),
        hint="the engine's own",
        why="the engine's OverlapLoop under the lab's name",
        kind="engine_reference",
    ),
    Mutant(
        "delegates_to_the_plain_loop",
        STEM,
        (
            (_IMPORT, _IMPORT + "from minisgl.scheduler.loops import PlainLoop\n"),
            ("        s = self.sched\n        batch = s.schedule()\n", "        return PlainLoop.step(self)\n"),
        ),
        must_fail=("first_step_launches_and_keeps_it_pending", "random_schedules"),
        hint="the engine's own",
        why="step() runs the engine's PlainLoop.step",
        kind="engine_reference",
    ),
    Mutant(
        "waits_on_the_launched_copy",
        STEM,
        ((_WAIT, "            s.wait(launched[2] if launched else previous_ready)\n"),),
        must_fail=("waits_before_processing", "random_schedules", "waits_on_the_processed_batch"),
        hint="another batch's copy",
        why="waits on the copy of the batch just launched, not of the one it processes (once only a hidden test "
        "saw it: on a CPU there is nothing to wait for)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "processes_the_device_tensor",
        STEM,
        ((_KEEP, "            launched = (batch, device_tokens, ready)\n"),),
        must_fail=("process_reads_the_host_copy", "random_schedules", "processes_the_host_copy"),
        hint="keep to_host's first result pending",
        why="process reads launch's device tensor instead of the host copy (the same tensor on a CPU: once only a "
        "hidden test saw it)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "processes_in_the_same_step",
        STEM,
        (
            ("        events: list[TokenEvent] = []\n", "        self.pending = launched\n        events = []\n"),
            (
                "        self.pending = launched\n        return events\n",
                "        self.pending = None\n        return events\n",
            ),
        ),
        must_fail=(
            "first_step_launches_and_keeps_it_pending",
            "launches_the_next_batch_before_processing",
            "random_schedules",
            "engine_one_step_behind",
        ),
        hint="in the same step that launched it",
        why="the plain loop: each batch is processed in the step that launched it, so nothing overlaps",
    ),
    Mutant(
        "processes_before_schedule",
        STEM,
        (
            (
                _BODY,
                "        s = self.sched\n"
                "        events: list[TokenEvent] = []\n" + _PROCESS_PENDING + "        batch = s.schedule()\n"
                "        launched = None\n"
                "        if batch is not None:\n"
                "            device_tokens = s.launch(batch, s.prepare(batch))\n"
                "            host_tokens, ready = s.to_host(device_tokens)\n"
                "            launched = (batch, host_tokens, ready)\n"
                "        self.free_finished(batch)\n"
                "        self.pending = launched\n"
                "        return events\n",
            ),
        ),
        must_fail=(
            "launches_the_next_batch_before_processing",
            "processes_each_batch_once_in_launch_order",
            "random_schedules",
            "engine_one_step_behind",
        ),
        hint="processed before schedule",
        why="the pending batch is processed first: the host works while the device has nothing queued",
    ),
    Mutant(
        "processes_before_launch",
        STEM,
        (
            (
                _BODY,
                "        s = self.sched\n"
                "        batch = s.schedule()\n"
                "        launched = None\n"
                "        if batch is not None:\n"
                "            info = s.prepare(batch)\n"
                "        events: list[TokenEvent] = []\n" + _PROCESS_PENDING + "        if batch is not None:\n"
                "            host_tokens, ready = s.to_host(s.launch(batch, info))\n"
                "            launched = (batch, host_tokens, ready)\n"
                "        self.free_finished(batch)\n"
                "        self.pending = launched\n"
                "        return events\n",
            ),
        ),
        must_fail=(
            "launches_the_next_batch_before_processing",
            "random_schedules",
            "engine_one_step_behind",
        ),
        hint="processed before launch",
        why="the device idles while the host processes",
    ),
    Mutant(
        "processes_one_step_late",
        STEM,
        (
            (
                "        self.pending = launched\n        return events\n",
                '        self.pending, self.later = getattr(self, "later", None), launched\n        return events\n',
            ),
        ),
        must_fail=(
            "launches_the_next_batch_before_processing",
            "processes_each_batch_once_in_launch_order",
            "random_schedules",
            "engine_one_step_behind",
        ),
        hint="one step late",
        why="two batches pending: each batch is processed two steps after its launch",
    ),
    Mutant(
        "never_drains",
        STEM,
        (
            (
                "        if self.pending is not None:\n",
                "        if self.pending is not None and launched is not None:\n",
            ),
        ),
        must_fail=(
            "drains_the_last_batch",
            "processes_each_batch_once_in_launch_order",
            "random_schedules",
            "engine_tokens_equal_the_plain_loop",
        ),
        hint="drain the pending batch",
        why="when schedule() returns None the pending batch is dropped: its requests never get their last token",
    ),
    Mutant(
        "skips_the_wait",
        STEM,
        (("            s.wait(previous_ready)\n", ""),),
        must_fail=("waits_before_processing", "random_schedules"),
        hint="without waiting",
        why="process reads the host copy without waiting for it: on a GPU it may not have landed",
    ),
    Mutant(
        "processes_newest_first",
        STEM,
        (
            (
                _BODY,
                "        s = self.sched\n"
                '        queue = self.__dict__.setdefault("queue", [])\n'
                "        batch = s.schedule()\n"
                "        if batch is not None:\n"
                "            queue.append((batch, *s.to_host(s.launch(batch, s.prepare(batch)))))\n"
                "        events: list[TokenEvent] = []\n"
                "        if len(queue) > 1 or (queue and batch is None):\n"
                "            previous, previous_tokens, previous_ready = queue.pop()\n"
                "            s.wait(previous_ready)\n"
                "            events = s.process(previous, previous_tokens)\n"
                "        self.free_finished(queue[-1][0] if queue else None)\n"
                "        self.pending = queue[0] if queue else None\n"
                "        return events\n",
            ),
        ),
        must_fail=(
            "launches_the_next_batch_before_processing",
            "processes_each_batch_once_in_launch_order",
            "random_schedules",
            "engine_tokens_equal_the_plain_loop",
        ),
        hint="the newest pending batch first",
        why="a stack instead of a queue: the batch just launched is processed before the older pending one",
    ),
    Mutant(
        "drops_draining_events",
        STEM,
        (
            (
                "            events = s.process(previous, previous_tokens)\n",
                "            events = s.process(previous, previous_tokens)\n"
                "            if launched is None:\n"
                "                events = []\n",
            ),
        ),
        must_fail=(
            "drains_the_last_batch",
            "processes_each_batch_once_in_launch_order",
            "random_schedules",
            "engine_tokens_equal_the_plain_loop",
        ),
        hint="return the tokens of the batch processed",
        why="the drained batch is processed but its tokens are not returned: the last token of a request is lost",
    ),
    Mutant(
        "launches_none",
        STEM,
        (("        if batch is not None:\n            device_tokens", "        if True:\n            device_tokens"),),
        must_fail=("drains_the_last_batch", "random_schedules", "engine_tokens_equal_the_plain_loop"),
        hint="prepare() was called with None",
        why="prepare and launch run even when schedule() returned None",
    ),
    Mutant(
        "in_flight_always_false",
        STEM,
        (("        return self.pending is not None\n", "        return False\n"),),
        must_fail=("in_flight", "random_schedules"),
        hint="in_flight was False",
        why="the scheduler stops stepping while a launched batch is still pending",
    ),
    Mutant(
        "processes_twice",
        STEM,
        (
            (
                "        self.pending = launched\n        return events\n",
                "        self.pending = launched or self.pending\n        return events\n",
            ),
        ),
        must_fail=(
            "drains_the_last_batch",
            "in_flight",
            "processes_each_batch_once_in_launch_order",
            "random_schedules",
        ),
        hint="processed twice",
        why="a processed batch stays pending when nothing new is launched: processed again, in_flight forever",
    ),
]

_FREE_LOOP = (
    "        for req in self.held + s.take_finished():\n"
    "            if req in reading:\n"
    "                keep.append(req)\n"
    "            else:\n"
    "                s.free(req)\n"
)

MUTANTS += [
    Mutant(
        "frees_the_rider",
        STEM,
        (("        reading = set(in_flight.reqs) if in_flight is not None else set()\n", "        reading = set()\n"),),
        must_fail=(
            "frees_a_request_only_after_its_last_batch",
            "random_schedules",
            "engine_frees_no_memory_in_use",
        ),
        hint="freed early",
        why="every finished request is freed right after process, also the one that rides along in the batch "
        "just launched, which still reads its row and KV pages",
    ),
    Mutant(
        "frees_all_or_none",
        STEM,
        (
            (
                _FREE_LOOP,
                "        finished = self.held + s.take_finished()\n"
                "        if any(req in reading for req in finished):\n"
                "            keep = finished\n"
                "        else:\n"
                "            for req in finished:\n"
                "                s.free(req)\n",
            ),
        ),
        must_fail=("frees_each_request_as_soon_as_no_batch_reads_it", "random_schedules"),
        hint="freed a step late",
        why="the finished requests are checked as a group: when one rides along, all are held a step longer",
        kind="each_part",
    ),
    Mutant(
        "never_frees_at_the_drain",
        STEM,
        (
            (
                "        self.free_finished(batch)\n",
                "        if batch is not None:\n            self.free_finished(batch)\n",
            ),
        ),
        must_fail=(
            "frees_at_the_drain_and_after_an_abort",
            "random_schedules",
            "engine_frees_no_memory_in_use",
        ),
        hint="nothing new was launched then",
        why="when nothing new is launched the held and newly finished requests are not freed: their memory never "
        "comes back",
    ),
]

# correct, written another way: it must keep every point
EQUIVALENT = Mutant(
    "lab08_with_a_queue",
    STEM,
    (
        (
            _BODY,
            "        from collections import deque\n"
            "\n"
            "        s = self.sched\n"
            '        queue = self.__dict__.setdefault("queue", deque())\n'
            "        batch = s.schedule()\n"
            "        if batch is not None:\n"
            "            info = s.prepare(batch)\n"
            "            queue.append((batch, *s.to_host(s.launch(batch, info))))\n"
            "        events = []\n"
            "        if len(queue) > 1 or (queue and batch is None):\n"
            "            done, tokens, ready = queue.popleft()\n"
            "            s.wait(ready)\n"
            "            events = s.process(done, tokens)\n"
            "        self.free_finished(queue[-1][0] if queue else None)\n"
            "        self.pending = queue[0] if queue else None\n"
            "        return events\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "waits_on_the_new_batch",
        STEM,
        (
            (
                "            s.wait(previous_ready)\n",
                "            s.wait(launched[2] if launched else previous_ready)\n",
            ),
        ),
        must_fail=("waits_on_the_processed_batch",),
        why="waits on the copy of the batch just launched, not of the one it processes (on a CPU, None either way)",
    ),
    Mutant(
        "processes_device_tokens",
        STEM,
        (
            (
                "            launched = (batch, host_tokens, ready)\n",
                "            launched = (batch, device_tokens, ready)\n",
            ),
        ),
        must_fail=("processes_the_host_copy",),
        why="process reads launch's device tensor instead of the host copy (the same tensor on a CPU)",
    ),
]
