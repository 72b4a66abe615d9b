"""Broken variants of solutions/lab03_paged_memory.py: one per pitfall its docstring names, one of each
kind of grader hole (``mutants.KINDS``), a correct one written another way (``EQUIVALENT``), and the
variants the hidden tests catch (``HIDDEN_MUTANTS``; the visible tests now catch them too)."""

from mutants import Mutant

STEM = "lab03_paged_memory"

_ALLOC_FIXED = (
    "allocator_starts_free",
    "alloc_hands_out_every_page_once",
    "out_of_memory_changes_nothing",
    "freed_pages_come_back",
    "double_free_raises",
    "bad_free_changes_nothing",
)
_TABLE_FIXED = (
    "rows",
    "map_pages_page_size_1",
    "map_pages_page_size_4",
    "map_pages_page_size_3",
    "set_slots",
    "dummy_row",
)
_CHECK_RANGE = "        if any(not 0 <= page < self.num_pages for page in ids):\n"
_CHECK_FREE = "len(set(ids)) != len(ids) or any(self.is_free[page] for page in ids)"
_ROW_CHECK = "        if not (0 <= row < self.max_rows and self.in_use[row]):\n"

# every fixed unit test -> the randomized test of the same part, which must fail with it
RANDOMIZED = {name: "allocator_random_operations" for name in _ALLOC_FIXED} | {
    name: "table_random_operations" for name in _TABLE_FIXED
}

MUTANTS = [
    Mutant(
        "alloc_keeps_pages_on_free_list",
        STEM,
        (
            (
                "        pages = [self.free_pages.popleft() for _ in range(n)]\n",
                "        pages = list(self.free_pages)[:n]\n",
            ),
        ),
        must_fail=("alloc_hands_out_every_page_once", "allocator_random_operations", "engine_matches_reference[1]"),
        hint="handed out twice",
        why="alloc reads the free list without taking its pages off: the next alloc hands them out again",
    ),
    Mutant(
        "free_accepts_double_free",
        STEM,
        (("len(set(ids)) != len(ids) or any(self.is_free[page] for page in ids)", "len(set(ids)) != len(ids)"),),
        must_fail=("double_free_raises", "bad_free_changes_nothing", "allocator_random_operations"),
        hint="a double free must raise RuntimeError",
        why="a page freed twice sits twice on the free list, and is later handed to two requests",
    ),
    Mutant(
        "free_accepts_a_page_twice_in_one_call",
        STEM,
        (
            (
                "len(set(ids)) != len(ids) or any(self.is_free[page] for page in ids)",
                "any(self.is_free[page] for page in ids)",
            ),
        ),
        must_fail=("double_free_raises", "allocator_random_operations"),
        hint="appears twice in one call",
        why="free([7, 7]) puts page 7 on the free list twice",
    ),
    Mutant(
        "free_skips_the_range_check",
        STEM,
        (
            (
                "        if any(not 0 <= page < self.num_pages for page in ids):\n"
                '            raise RuntimeError(f"free of a page outside the pool [0, {self.num_pages}): {ids}")\n',
                "",
            ),
        ),
        must_fail=("bad_free_changes_nothing", "allocator_random_operations"),
        hint="outside the pool",
        why="page -1 indexes is_free from the end (page num_pages - 1) and lands on the free list",
    ),
    Mutant(
        "alloc_takes_pages_before_raising",
        STEM,
        (
            (
                "        if n > len(self.free_pages):\n"
                '            raise MemoryError(f"asked for {n} KV pages, {len(self.free_pages)} free")\n'
                "        pages = [self.free_pages.popleft() for _ in range(n)]\n",
                "        pages = [self.free_pages.popleft() for _ in range(min(n, len(self.free_pages)))]\n"
                "        if len(pages) < n:\n"
                '            raise MemoryError(f"asked for {n} KV pages, {len(pages)} free")\n',
            ),
        ),
        must_fail=("out_of_memory_changes_nothing", "allocator_random_operations"),
        hint="alloc changed the allocator before raising",
        why="a refused alloc empties the free list: those pages are lost for good",
    ),
    Mutant(
        "free_frees_until_a_bad_page",
        STEM,
        (
            (
                "        if len(set(ids)) != len(ids) or any(self.is_free[page] for page in ids):\n"
                '            raise RuntimeError(f"double free of a KV page: {ids}")\n'
                "        for page in ids:\n"
                "            self.is_free[page] = True\n"
                "        self.free_pages.extend(ids)\n",
                "        for page in ids:\n"
                "            if self.is_free[page]:\n"
                '                raise RuntimeError(f"double free of KV page {page}")\n'
                "            self.is_free[page] = True\n"
                "            self.free_pages.append(page)\n",
            ),
        ),
        must_fail=("bad_free_changes_nothing", "allocator_random_operations"),
        hint="a refused free changed the allocator before raising",
        why="a free with one bad page has already freed the good pages before it when it raises",
    ),
    Mutant(
        "free_never_returns_pages",
        STEM,
        (
            (
                "            self.is_free[page] = True\n        self.free_pages.extend(ids)\n",
                "            self.is_free[page] = True\n",
            ),
        ),
        must_fail=("freed_pages_come_back", "allocator_random_operations", "engine_frees_everything"),
        hint="the freed pages never came back",
        why="freed pages are flagged free but never put back on the free list: num_free falls short, memory leaks",
    ),
    Mutant(
        "map_pages_slot_is_the_page",
        STEM,
        (("self.write(row, pos, page * p + pos % p)", "self.write(row, pos, page)"),),
        must_fail=("map_pages_page_size_4", "table_random_operations", "engine_matches_reference[16]"),
        hint="map_pages ignores page_size",
        why="slot = page id: right for one-token pages only; with bigger pages requests overwrite each other",
    ),
    Mutant(
        "map_pages_offset_not_reset_per_page",
        STEM,
        (("self.write(row, pos, page * p + pos % p)", "self.write(row, pos, page * p + (pos - start))"),),
        must_fail=("map_pages_page_size_1", "map_pages_page_size_4", "table_random_operations"),
        hint="the offset in a page must restart at 0",
        why="the offset keeps counting past the end of the first page, into pages the request does not own",
    ),
    Mutant(
        "map_pages_every_request_from_the_first_page",
        STEM,
        (("            k += (end - start) // p\n", ""),),
        must_fail=("map_pages_page_size_1", "map_pages_page_size_4", "table_random_operations"),
        hint="request after request",
        why="every request of a batch starts at pages[0]: two requests share a page, the other pages are lost",
    ),
    Mutant(
        "set_slots_one_position_off",
        STEM,
        (
            (
                "self.write(row, torch.arange(start, start + len(slots), dtype=torch.int64), slots)",
                "self.write(row, torch.arange(start + 1, start + len(slots) + 1, dtype=torch.int64), slots)",
            ),
        ),
        must_fail=("set_slots", "table_random_operations"),
        hint="one position off",
        why="a cached prefix lands one position late: the first token keeps a stale slot",
    ),
    Mutant(
        "slots_returns_int32",
        STEM,
        (
            (
                "        return self.page_table_cpu[row, start:end].to(torch.int64)\n",
                "        return self.page_table_cpu[row, start:end]\n",
            ),
        ),
        must_fail=("map_pages_page_size_1", "table_random_operations"),
        hint="int64",
        why="slots() returns the table's int32 entries (and a view of it)",
    ),
    Mutant(
        "dummy_row_handed_out",
        STEM,
        (
            (
                "        self.free_rows: list[int] = list(range(max_rows - 1, -1, -1))  # pop() hands out row 0 first\n"
                "        self.in_use: list[bool] = [False] * max_rows\n",
                "        self.free_rows: list[int] = list(range(max_rows, -1, -1))  # pop() hands out row 0 first\n"
                "        self.in_use: list[bool] = [False] * (max_rows + 1)\n",
            ),
        ),
        must_fail=("rows", "table_random_operations"),
        hint="the dummy row is never handed out",
        why="the dummy row is a free row too: a request gets it, and CUDA-graph padding writes over its KV",
    ),
    Mutant(
        "free_row_does_not_check",
        STEM,
        (
            (
                "        if not (0 <= row < self.max_rows and self.in_use[row]):\n"
                '            raise RuntimeError(f"free_row({row}): the row is not in use")\n',
                "",
            ),
        ),
        must_fail=("rows", "table_random_operations"),
        hint="must raise RuntimeError",
        why="a row freed twice is on the free list twice: two requests get the same row",
    ),
    Mutant(
        "dummy_row_fills_the_row_above",
        STEM,
        (
            (
                "        self.page_table[self.dummy_row].fill_(slot)\n"
                "        self.page_table_cpu[self.dummy_row].fill_(slot)\n",
                "        self.page_table[self.dummy_row - 1].fill_(slot)\n"
                "        self.page_table_cpu[self.dummy_row - 1].fill_(slot)\n",
            ),
        ),
        must_fail=("dummy_row", "table_random_operations"),
        hint="every position of the dummy row must map to 99",
        why="point_dummy_row_at fills the last request row: padding then writes a real request's KV",
    ),
]

# one of each kind of hole a careful student finds in a grader (mutants.KINDS)
MUTANTS += [
    Mutant(
        "alloc_refuses_exactly_num_free",
        STEM,
        (("        if n > len(self.free_pages):\n", "        if n >= len(self.free_pages):\n"),),
        must_fail=("out_of_memory_changes_nothing", "alloc_hands_out_every_page_once", "allocator_random_operations"),
        hint="only asking for more than num_free raises",
        why="n >= num_free raises: the last free pages can never be handed out",
        kind="boundary",
    ),
    Mutant(
        "free_checks_only_the_first_page",
        STEM,
        (
            (_CHECK_RANGE, _CHECK_RANGE.replace("for page in ids", "for page in ids[:1]")),
            (_CHECK_FREE, _CHECK_FREE.replace("for page in ids", "for page in ids[:1]")),
        ),
        must_fail=("bad_free_changes_nothing", "allocator_random_operations"),
        hint="check every page, not only the first",
        why="free checks the range and the double free on the call's first page only: a bad page after it is freed",
        kind="one_argument",
    ),
    Mutant(
        "double_free_found_by_count",
        STEM,
        ((_CHECK_FREE, "len(set(ids)) != len(ids) or len(self.free_pages) + len(ids) > self.num_pages"),),
        must_fail=("double_free_raises", "allocator_random_operations"),
        hint="a double free must raise RuntimeError",
        why="a double free caught only when the free pages would outnumber the pool: with other pages held, "
        "a page freed twice passes",
        kind="each_part",
    ),
    Mutant(
        "map_pages_serves_rows_in_ascending_order",
        STEM,
        (
            (
                "        for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist()):\n",
                "        for row, start, end in sorted(zip(rows.tolist(), starts.tolist(), ends.tolist())):\n",
            ),
        ),
        must_fail=("map_pages_page_size_4", "table_random_operations"),
        hint="in the order they come in rows",
        why="the requests take their pages sorted by row number, not in the order rows lists them",
        kind="order",
    ),
    Mutant(
        "map_pages_by_the_engine",
        STEM,
        (
            (
                "from minisgl.kvcache.table import ReqTable\n",
                "from minisgl.kvcache.table import ReqTable, ragged_index\n",
            ),
            (
                "        p, k = self.page_size, 0  # k: the first page of this request's share of pages\n"
                "        for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist()):\n"
                "            pos = torch.arange(start, end, dtype=torch.int64)\n"
                "            page = pages[k + (pos - start) // p]\n"
                "            self.write(row, pos, page * p + pos % p)\n"
                "            k += (end - start) // p\n",
                "        new_rows, new_cols = ragged_index(rows, starts, ends)\n"
                "        p = self.page_size\n"
                "        self.write(new_rows, new_cols, (pages[:, None] * p + torch.arange(p)[None, :]).flatten())\n",
            ),
        ),
        must_fail=("map_pages_page_size_1", "rows", "allocator_starts_free"),
        hint="the engine's own",
        why="map_pages delegates to the engine's ragged_index: the lab scores 0",
        kind="engine_reference",
    ),
    Mutant(
        "free_row_accepts_a_negative_row",
        STEM,
        ((_ROW_CHECK, "        if not self.in_use[row]:\n"),),
        must_fail=("rows", "table_random_operations"),
        hint="a negative row silently indexes from the end",
        why="free_row(-1) frees row max_rows - 1 (Python's negative index); once a hidden-only bug",
        kind="visible_on_cpu",
    ),
    Mutant(
        "map_pages_offset_by_bit_mask",
        STEM,
        (("self.write(row, pos, page * p + pos % p)", "self.write(row, pos, page * p + (pos & (p - 1)))"),),
        must_fail=("map_pages_page_size_3", "table_random_operations"),
        hint="pos & (page_size - 1) is that only for powers of two",
        why="the offset in a page by a bit mask: wrong at page size 3; once a hidden-only bug",
        kind="visible_on_cpu",
    ),
]

# correct, written the other ways a student may: it must keep every point
EQUIVALENT = Mutant(
    "lab03_written_differently",
    STEM,
    (
        (  # a stack of free pages (last freed, first handed out) and a set of handed-out pages
            "self.free_pages: deque[int] = deque(range(num_pages))",
            "self.held: set[int] = set()\n        self.free_pages: list[int] = list(range(num_pages - 1, -1, -1))",
        ),
        (
            "        pages = [self.free_pages.popleft() for _ in range(n)]\n"
            "        for page in pages:\n"
            "            self.is_free[page] = False\n",
            "        pages = [self.free_pages.pop() for _ in range(n)]\n        self.held.update(pages)\n",
        ),
        (
            "        if len(set(ids)) != len(ids) or any(self.is_free[page] for page in ids):\n",
            "        if len(set(ids)) != len(ids) or not self.held.issuperset(ids):\n",
        ),
        (
            "        for page in ids:\n            self.is_free[page] = True\n        self.free_pages.extend(ids)\n",
            "        self.held.difference_update(ids)\n        self.free_pages.extend(reversed(ids))\n",
        ),
        (  # map_pages vectorized over the whole batch (the engine's way), a set of rows in use
            "        p, k = self.page_size, 0  # k: the first page of this request's share of pages\n"
            "        for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist()):\n"
            "            pos = torch.arange(start, end, dtype=torch.int64)\n"
            "            page = pages[k + (pos - start) // p]\n"
            "            self.write(row, pos, page * p + pos % p)\n"
            "            k += (end - start) // p\n",
            "        p, lens = self.page_size, ends - starts\n"
            "        flat_rows = torch.repeat_interleave(rows, lens)\n"
            "        first = torch.repeat_interleave(torch.cumsum(lens, 0) - lens - starts, lens)\n"
            "        flat_pos = torch.arange(int(lens.sum())) - first\n"
            "        slots = (pages[:, None] * p + torch.arange(p)[None, :]).flatten()\n"
            "        self.write(flat_rows, flat_pos, slots)\n",
        ),
        (
            "        self.write(row, torch.arange(start, start + len(slots), dtype=torch.int64), slots)\n",
            "        for i, slot in enumerate(slots.tolist()):\n"
            "            self.write(row, start + i, torch.tensor(slot))\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "alloc_zero_is_float",
        STEM,
        (("        return torch.tensor(pages, dtype=torch.int64)\n", "        return torch.tensor(pages)\n"),),
        must_fail=("alloc_zero_pages",),
        why="torch.tensor([]) is float32: alloc(0) returns a float tensor (every other alloc is int64)",
    ),
    Mutant(
        "free_row_without_range_check",
        STEM,
        ((_ROW_CHECK, "        if not self.in_use[row]:\n"),),
        must_fail=("free_row_rejects_dummy_and_negative_rows",),
        why="free_row(-1) frees the last request row (Python's negative index), free_row(dummy_row) raises IndexError",
    ),
    Mutant(
        "page_offset_by_bit_mask",
        STEM,
        (("self.write(row, pos, page * p + pos % p)", "self.write(row, pos, page * p + (pos & (p - 1)))"),),
        must_fail=("map_pages_odd_page_sizes[3]", "map_pages_odd_page_sizes[6]"),
        why="pos & (page_size - 1) is the offset only when page_size is a power of two",
    ),
]
