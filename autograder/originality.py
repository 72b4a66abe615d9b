"""A lab is graded on the student's own code: the engine's implementation of the lab's component
(or a subclass, an alias or a wrapper of it) is refused, and the lab scores 0 with a message that
says where.

Each lab lists, in ``LABS``, the engine objects that implement what it asks for (``engine``: the
reference the tests compare with, and any default of the interface that holds part of the answer)
and, for each class the lab file defines, the methods the student must write there (``own``). Two
checks use the list:

* **When the grader takes an object from the lab file** (``impl.require``, ``check_object``): a
  class must not be, or derive from, an engine reference class, and each of its ``own`` methods
  must be a function written in the lab file (not inherited from the interface or borrowed from the
  engine); a function must not be an engine reference (or a ``functools.partial`` /
  ``functools.wraps`` of one); an object holding classes (lab 11's ``TextStreams``) is checked
  field by field.
* **While the tests run** (``install``): every reference function and method is replaced, in every
  ``minisgl`` module and class that holds it, by a tripwire that calls it as before unless code of
  the graded folder is on the call stack: a student's function that delegates to the engine's.
  That raises ``EngineReference`` and is remembered even if the student's code catches it.

Either way the test fails with the message, and ``results.py`` gives every test of the lab 0 (the
engine's own answer, found in one test, would earn the others too: the swap-in tests run the engine
in other processes, where the tripwires are not installed).

What this does not catch: the engine's code copied into the lab file, or reached through ``exec`` or
a thread. The lab docstrings say the engine's own code is off limits; the course staff reads code.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LabReferences:
    engine: tuple[str, ...]  # "module:qualname" of what implements the lab's component in the engine
    own: dict[str, tuple[str, ...]] = field(default_factory=dict)  # lab class -> methods written in the lab file


LABS: dict[str, LabReferences] = {
    "lab01": LabReferences(
        (
            "minisgl.layers.norm:rms_norm",
            "minisgl.layers.norm:RMSNorm",
            "minisgl.layers.rotary:rope_inv_freq",
            "minisgl.layers.rotary:apply_rotary",
            "minisgl.layers.rotary:RotaryEmbedding",
            "minisgl.layers.activation:silu_and_mul",
            "minisgl.kernels.cpu_fused:rmsnorm",
            "minisgl.kernels.cpu_fused:fused_add_rmsnorm",
            "minisgl.kernels.cpu_fused:silu_and_mul",
            "minisgl.kernels.cpu_fused:apply_rope_with_cos_sin_cache_inplace",
            "minisgl.kernels.jit:cpu_module",  # the C++ kernels themselves (rmsnorm, silu_and_mul, rope, attention)
            "minisgl.kernels.paged_attention:paged_decode_attention",
            "minisgl.kernels.paged_attention:paged_decode_attention_torch",
            "minisgl.attention.torch_backend:TorchBackend",
            "minisgl.layers:LayerImpls",  # its defaults are the engine's functions
            "minisgl.registry:Registry.get",  # NORMS / ROTARIES / ACTIVATIONS.get("default") too
        )
    ),
    "lab02": LabReferences(
        ("minisgl.engine.sample:filter_logits", "minisgl.engine.sample:DefaultSampler"),
        {"LabSampler": ("sample",)},
    ),
    "lab03": LabReferences(
        (
            "minisgl.kvcache.allocator:FreeListAllocator",
            "minisgl.kvcache.table:TensorReqTable",
            "minisgl.kvcache.table:ragged_index",
        ),
        {
            "Allocator": ("num_free", "alloc", "free"),
            "RequestTable": (
                "num_free_rows",
                "alloc_row",
                "free_row",
                "map_pages",
                "set_slots",
                "slots",
                "slots_at",
                "point_dummy_row_at",
            ),
        },
    ),
    "lab04": LabReferences(
        (
            "minisgl.attention.torch_backend:TorchBackend",
            "minisgl.kernels.paged_attention:paged_decode_attention",
            "minisgl.kernels.paged_attention:paged_decode_attention_torch",
        ),
        {"PagedAttentionBackend": ("prepare_metadata", "forward")},
    ),
    "lab05": LabReferences(
        (
            "minisgl.scheduler.admission:ReserveAll",
            "minisgl.scheduler.admission:Optimistic",
            "minisgl.scheduler.admission:AdmissionPolicy.reserved_len",  # the interface's default is the answer
        ),
        {"FairAdmission": ("reserved_len", "fits", "admit")},
    ),
    "lab06": LabReferences(
        ("minisgl.kvcache.radix:RadixPrefixCache", "minisgl.kvcache.radix:RadixNode"),
        {"RadixCache": ("match_prefix", "lock", "unlock", "insert", "evict", "evictable_size", "protected_size")},
    ),
    "lab07": LabReferences(
        (  # the interface's three methods are abstract
            "minisgl.scheduler.chunking:GreedyChunking",
            "minisgl.scheduler.timed:TimedChunking",
            "minisgl.scheduler.timed:chunk_time",
            "minisgl.scheduler.timed:fit_cost",
        ),
        {"TimedChunking": ("budget", "extend_end", "decode_first")},
    ),
    "lab08": LabReferences(
        ("minisgl.scheduler.loops:OverlapLoop", "minisgl.scheduler.loops:PlainLoop"),
        {"OverlapLoop": ("step", "free_finished", "in_flight")},
    ),
    "lab09": LabReferences(
        (  # GraphPlan: abstract
            "minisgl.engine.graph:BucketPlan",
            "minisgl.engine.graph:GraphRunner",
            "minisgl.engine.graph:graph_batch_sizes",
        ),
        {"PaddedPlan": ("candidates", "sizes", "capture", "use_graph", "bucket", "pad", "replay")},
    ),
    "lab10": LabReferences(
        (
            "minisgl.layers.linear:ColumnParallelLinear",
            "minisgl.layers.linear:MergedColumnParallelLinear",
            "minisgl.layers.linear:QKVParallelLinear",
            "minisgl.layers.linear:RowParallelLinear",
            "minisgl.layers.embedding:VocabParallelEmbedding",
            "minisgl.layers.embedding:ParallelLMHead",
        ),
        {  # what each class must take from the lab file, inherited from the lab's base class or its own
            "ColumnParallelLinear": ("_slice", "load_shard"),
            "MergedColumnParallelLinear": ("__init__", "_slice", "load_shard"),
            "QKVParallelLinear": ("__init__", "_slice", "load_shard"),
            "RowParallelLinear": ("load_weight", "forward"),
            "VocabParallelEmbedding": ("__init__", "load_weight", "forward"),
            "ParallelLMHead": ("load_weight", "forward"),
        },
    ),
    "lab11": LabReferences(
        (
            "minisgl.tokenizer.detokenizer:IncrementalDecoder",
            "minisgl.tokenizer.detokenizer:StopStringCutter",
            "minisgl.tokenizer.detokenizer:text_streams",
        ),
        {  # the classes, and the same classes as TEXT_STREAMS holds them (checked field by field)
            "LabDetokenizer": ("push", "flush"),
            "LabStopStrings": ("feed", "flush"),
            "TEXT_STREAMS.detokenizer": ("push", "flush"),
            "TEXT_STREAMS.stop_strings": ("feed", "flush"),
        },
    ),
    "lab12": LabReferences(
        (
            "minisgl.benchmark.metrics:percentile",
            "minisgl.benchmark.metrics:summary",
            "minisgl.benchmark.metrics:request_metrics",
            "minisgl.benchmark.metrics:latency_metrics",
            "minisgl.benchmark.online:percentiles",  # a summary() under another name
            "minisgl.benchmark.roofline:param_count",
            "minisgl.benchmark.roofline:decode_step_bytes",
            "minisgl.benchmark.roofline:decode_roofline",
        ),
    ),
    "lab13": LabReferences(
        (
            "minisgl.kernels.paged_attention:paged_decode_attention_cpp",
            "minisgl.kernels.paged_attention:paged_decode_attention_torch",
            "minisgl.kernels.paged_attention:paged_decode_attention",  # the seam: the engine's kernel by default
            "minisgl.kernels.jit:cpu_module",  # the engine's compiled C++ (its paged_decode_attention)
        )
    ),
    "lab14": LabReferences(
        (
            "minisgl.grammar.dfa_backend:DFABackend",
            "minisgl.grammar.dfa_backend:DFAMatcher",
            "minisgl.grammar.dfa_backend:vocab_bytes",
            "minisgl.grammar.dfa_backend:walk",
            "minisgl.grammar.base:pack_bitmask",  # the packing the lab asks for
            "minisgl.grammar.xgrammar_backend:XGrammarBackend",
            "minisgl.grammar.xgrammar_backend:XGrammarMatcher",
        ),
        {
            "LabGrammarBackend": ("__init__", "compile", "row"),
            "LabMatcher": ("accept_token", "fill_bitmask", "is_terminated"),
        },
    ),
    "lab15": LabReferences(
        (  # the seam's methods are abstract; the sampler (sample, filter_logits, uniform) is lab 02's, allowed
            "minisgl.speculative.verify:DefaultVerifier",
            "minisgl.speculative.verify:per_position",
            "minisgl.speculative.verify:leading",
        ),
        {"LabVerifier": ("verify", "rollback")},
    ),
}

_MARK = "__ag_engine_reference__"  # set on a tripwire: the dotted name of the reference it guards
FOUND: list[str] = []  # what the running test was caught using, in this process
_installed: dict[str, dict[int, str]] = {}  # lab -> {id of a reference function or class: its name}


class EngineReference(TypeError):
    """The lab file uses the engine's own implementation of the lab's component."""


def lab_of_stem(stem: str) -> str:
    return stem.split("_")[0]


def _resolve(dotted: str) -> Any:
    module, _, qualname = dotted.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj


def references(lab: str) -> dict[int, str]:
    """``{id(obj): "module:qualname"}`` of the lab's engine references: classes, functions, and the
    functions of each reference class's own methods (their originals and their tripwires)."""
    if lab in _installed:
        return _installed[lab]
    out: dict[int, str] = {}
    for dotted in LABS.get(lab, LabReferences(())).engine:
        obj = _resolve(dotted)
        out[id(_function(obj) or obj)] = dotted
        if isinstance(obj, type):
            for name, value in vars(obj).items():
                fn = _function(value)
                if fn is not None:
                    out[id(fn)] = f"{dotted}.{name}"
    return out


def _function(value: Any) -> Any:
    """The plain function inside a function, staticmethod, classmethod or property (its getter);
    else None."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value if inspect.isfunction(value) else None


def original(fn: Any) -> Any:
    """The reference behind a tripwire (``fn`` itself if it is none): for the grader's own use of
    the engine inside the lab module (lab 12 grades ``latency_metrics`` with the reference helpers)."""
    return fn.__wrapped__ if getattr(fn, _MARK, None) is not None else fn


def _unwrap(obj: Any) -> Any:
    while True:
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif getattr(obj, _MARK, None) is None and getattr(obj, "__wrapped__", None) is not None:
            obj = obj.__wrapped__
        else:
            return obj


def _refuse(text: str) -> EngineReference:
    FOUND.append(text)
    return EngineReference(text)


def check_object(stem: str, attr: str, obj: Any, lab_file: Path) -> None:
    """Raise ``EngineReference`` if ``obj`` (the lab file's ``attr``) is, derives from or wraps the
    engine's implementation of the lab's component, or leaves one of its own methods to another file."""
    lab = lab_of_stem(stem)
    refs = references(lab)
    if not refs and lab not in LABS:
        return
    where = f"{lab_file.name}'s {attr}"
    if isinstance(obj, type):
        for base in obj.__mro__:
            if id(base) in refs:
                what = "is" if base is obj else "derives from"
                raise _refuse(
                    f"{where} {what} the engine's own {refs[id(base)]}: the lab asks you to write it. Derive from the "
                    "interface only and write the methods in your lab file (graded 0 until then)"
                )
        for name in LABS[lab].own.get(attr, ()):
            fn = _function(inspect.getattr_static(obj, name, None))
            fn = _unwrap(fn) if fn is not None else None
            if fn is None or Path(fn.__code__.co_filename).resolve() != lab_file.resolve():
                source = "nowhere" if fn is None else f"{fn.__module__}.{fn.__qualname__}"
                raise _refuse(
                    f"{where}.{name} is not written in {lab_file.name} (it comes from {source}): the lab asks you to "
                    f"write {attr}.{name} yourself (graded 0 until then)"
                )
        return
    target = _unwrap(obj)
    name = getattr(target, _MARK, None) or refs.get(id(target))
    if name is not None:
        raise _refuse(f"{where} is the engine's own {name}: the lab asks you to write it (graded 0 until then)")
    if not (inspect.isfunction(obj) or inspect.ismodule(obj) or isinstance(obj, functools.partial)):
        if id(type(obj)) in refs:  # an instance of an engine reference class
            raise _refuse(f"{where} is an instance of the engine's own {refs[id(type(obj))]} (graded 0 until then)")
        if is_dataclass(obj):  # an object holding the lab's classes (lab 11's TextStreams)
            for f in fields(obj):
                value = getattr(obj, f.name)
                if isinstance(value, type) or callable(value):
                    check_object(stem, f"{attr}.{f.name}", value, lab_file)


def install(stem: str, graded_folder: Path) -> None:
    """Tripwires on the lab's engine references in this process (and the processes it forks): they
    fire for calls from the lab's file (or another file of the graded folder that is no other lab's:
    the student's helpers), never from another lab's file (a plain ``pytest autograder`` collects
    several labs, and lab 08's loop runs the engine's lab 07 policy through the scheduler)."""
    lab = lab_of_stem(stem)
    if lab in _installed or lab not in LABS:
        return
    folder = str(graded_folder.resolve()) + os.sep
    own_file = f"{stem}.py"

    def graded(filename: str) -> bool:
        if not filename.startswith(folder):
            return False
        name = filename[len(folder) :]
        return name == own_file or re.match(r"lab\d\d_", name) is None

    originals = references(lab)
    swaps: dict[int, Any] = {}  # id of an original function -> its tripwire
    for dotted in LABS[lab].engine:
        obj = _resolve(dotted)
        if isinstance(obj, type):
            for name, value in list(vars(obj).items()):
                fn = _function(value)
                if fn is not None and not isinstance(value, property):  # an instance's methods guard its properties
                    trip = swaps.setdefault(id(fn), _tripwire(fn, f"{dotted}.{name}", graded))
                    setattr(obj, name, type(value)(trip) if isinstance(value, staticmethod | classmethod) else trip)
        elif inspect.isfunction(obj):
            owner, _, method = dotted.partition(":")[2].rpartition(".")
            trip = swaps.setdefault(id(obj), _tripwire(obj, dotted, graded))
            if owner:  # a method of an interface that holds part of the answer (AdmissionPolicy.reserved_len)
                setattr(_resolve(f"{dotted.partition(':')[0]}:{owner}"), method, trip)
    for module in [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "minisgl" and m is not None]:
        for name, value in list(vars(module).items()):
            if inspect.isfunction(value) and id(value) in swaps:
                setattr(module, name, swaps[id(value)])
    for trip in swaps.values():
        originals[id(trip)] = getattr(trip, _MARK)
    _installed[lab] = originals


_REFERENCE_CODE: set = set()  # code objects of the guarded references


def _tripwire(fn: Any, dotted: str, graded: Any) -> Any:
    """``fn``, refusing a call whose nearest caller that is graded code or reference code is graded
    code: a reference called by another reference (the engine's ``summary`` calling its
    ``percentile``, where the grader put that ``summary`` into the lab module) is the engine at work."""
    _REFERENCE_CODE.add(fn.__code__)

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code not in _REFERENCE_CODE:
            if graded(frame.f_code.co_filename):
                where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}()"
                raise _refuse(
                    f"your code calls the engine's own {dotted} ({where}): the lab asks you to write it, not to "
                    "delegate to the engine (graded 0 until then)"
                )
            frame = frame.f_back
        return fn(*args, **kwargs)

    setattr(guarded, _MARK, dotted)
    return guarded
