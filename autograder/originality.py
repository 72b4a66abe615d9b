"""A lab is graded on the student's own code: the engine's implementation of the lab's component
(and the grader's own reference answers) refuse to work for a lab file, whatever the route, and the lab
scores 0 with a message that says where (file:line).

Each lab lists, in ``LABS``, what implements the lab's component: ``engine`` (the engine's classes and
functions, and the grader's reference policies and helpers), ``own`` (for each class the lab file
defines, the methods the student must write there) and ``shortcuts`` (library functions the lab's
docstring forbids, such as torch's fused attention in lab 01). While a lab is graded:

* **The reference code guards itself.** ``install`` recompiles every reference function and method
  (and every private helper of a module that holds one) from its source with one statement first:
  a guard that refuses to run when the nearest caller that is graded code or reference code is graded
  code (a file of the graded folder: the lab file, or a helper of the student's beside it). The
  function objects keep their identity and only their code changes, so every route to them runs the
  guard: an alias, ``functools.partial``, ``__wrapped__`` / ``inspect.unwrap``, a subclass, a method
  taken from the class, the engine's private build helpers, a copy of the code under a new function
  object (refused outright: the guard only runs inside the code it was compiled into).
* **Reference objects must be the engine's.** A reference class counts the instances it makes
  itself (``cls(...)``) while no graded code asks; its methods refuse an instance it did not make:
  one built with ``object.__new__`` and handed out by the lab, or a lab object whose ``__class__``
  was changed to a reference class. The grader checks the type of what it takes from the lab
  (``check_object``, ``check_instance``): a lab class must not be or derive from a reference class,
  must write its ``own`` methods in the lab file, and must not define ``__new__``.
* **Nothing runs the reference on the lab's behalf elsewhere.** Every process that loads lab code
  installs the same guards first (``autograder.impl.load``: the tensor-parallel ranks of lab 10, the
  server processes of lab 11); a thread started by lab code counts as lab code; lab code may start
  no process but the C++ toolchain (a Python started to run the engine would be out of sight).
* **Library shortcuts and loaders.** ``shortcuts`` are refused when lab code calls them; ``loaders``
  (lab 13: every ``tvm_ffi`` and ``ctypes`` loader) refuse, for lab code, sources or libraries
  that a lab's ``loader_check`` recognises as the engine's.

A refusal raises ``EngineReference``, is remembered even if the student's code catches it (``FOUND``,
and the file ``$MINISGL_AG_FOUND`` for refusals in other processes), and ``results.py`` gives every
test of the lab 0: the engine's answer, found in one test, would earn the others too.

What this does not catch: the engine's code copied into the lab file (the lab docstrings say the
engine's own code is off limits; the course staff reads code), or a lab that switches the guards off
(``sys.settrace``-level tampering with the grader itself).
"""

from __future__ import annotations

import ast
import functools
import gc
import importlib
import inspect
import os
import re
import sys
import threading
import types
import weakref
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LabReferences:
    engine: tuple[str, ...]  # "module:qualname" of what implements the lab's component (engine or grader)
    own: dict[str, tuple[str, ...]] = field(default_factory=dict)  # lab class -> methods written in the lab file
    shortcuts: tuple[str, ...] = ()  # "module:attr" of library functions the lab's docstring forbids
    loaders: tuple[str, ...] = ()  # "module:attr" of loaders whose arguments ``loader_check`` inspects
    loader_check: str = ""  # "module:function(args, kwargs) -> why or None": is it the engine's code?


_TVM_LOADERS = (
    "tvm_ffi.cpp:load_inline",
    "tvm_ffi.cpp:build_inline",
    "tvm_ffi.cpp:build",
    "tvm_ffi.cpp:load",
    "tvm_ffi:load_module",
    "ctypes:CDLL",
    "ctypes:PyDLL",
    "torch.ops:load_library",
    "torch.utils.cpp_extension:load_inline",
    "torch.utils.cpp_extension:load",
)

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
            "minisgl.kernels.jit:kernels",  # the engine's chosen set of them (its .lib is that library)
            "minisgl.kernels.jit:choose",
            "minisgl.kernels.paged_attention:paged_decode_attention",
            "minisgl.kernels.paged_attention:paged_decode_attention_torch",
            "minisgl.attention.torch_backend:TorchBackend",
            "minisgl.layers:LayerImpls",  # its defaults are the engine's functions
            "minisgl.registry:Registry.get",  # NORMS / ROTARIES / ACTIVATIONS.get("default") too
        ),
        shortcuts=(  # "attention ... in float32 throughout": torch's fused attention is the lab's answer
            "torch.nn.functional:scaled_dot_product_attention",
            "torch._C._nn:scaled_dot_product_attention",
        ),
    ),
    "lab02": LabReferences(
        (
            "minisgl.engine.sample:filter_logits",
            "minisgl.engine.sample:DefaultSampler",
        ),
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
            "autograder.scheduler_sim:Reference",  # the grader's reference policy
            "autograder.scheduler_sim:Probe",  # the grader's view of a context: whether a request fits, its rank
        ),
        {"CacheAwareAdmission": ("reserved_len", "admit")},
    ),
    "lab06": LabReferences(
        (
            "minisgl.kvcache.radix:RadixPrefixCache",
            "minisgl.kvcache.radix:RadixNode",
        ),
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
        (
            "minisgl.scheduler.loops:OverlapLoop",
            "minisgl.scheduler.loops:PlainLoop",
        ),
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
        shortcuts=("tokenizers.decoders:DecodeStream",),  # the tokenizers library's incremental decoder
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
            "minisgl.kernels.jit:kernels",  # the same library, as the engine's chosen set
            "minisgl.kernels.jit:choose",
        ),
        loaders=_TVM_LOADERS,
        loader_check="autograder.adapters.lab13:engine_build_used",
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
    "lab16": LabReferences(
        (  # decode is also the triton backend's seam default (DECODE_KERNELS["default"]); the kernels refuse launches
            "minisgl.kernels.triton_attention:decode",
            "minisgl.kernels.triton_attention:merge",
            "minisgl.kernels.triton_attention:_decode_kernel",
            "minisgl.kernels.triton_attention:_merge_kernel",
        ),
    ),
}

GUARD_ENV = "MINISGL_AG_GUARD"  # set while grading: every process that loads a lab file installs the guards
FOUND_ENV = "MINISGL_AG_FOUND"  # a file each refusal is appended to (refusals in other processes)
FOUND: list[str] = []  # what the running test was caught using, in this process


def name_found_file() -> str:
    """Point ``$MINISGL_AG_FOUND`` at a fresh file for the test about to run (and the processes it starts);
    returns its path."""
    import tempfile
    import time

    path = os.path.join(tempfile.gettempdir(), f"minisgl-ag-found-{os.getpid()}-{time.monotonic_ns()}.txt")
    os.environ[FOUND_ENV] = path
    return path


TOOLCHAIN = {"ninja", "c++", "g++", "gcc", "cc", "clang", "clang++", "ld", "nvcc", "cl", "link"}
_GUARD_NAME = "__ag_guard__"
_NO_SELF = object()


class EngineReference(TypeError):
    """The lab file uses the engine's own implementation of the lab's component."""


def lab_of_stem(stem: str) -> str:
    return stem.split("_")[0]


# ---- state of this process -------------------------------------------------------------------------------
@dataclass
class _State:
    folder: str | None = None  # the graded folder, with a trailing separator
    stems: dict[str, str] = field(default_factory=dict)  # lab -> stem, for the installed labs
    code_labs: dict[int, set[str]] = field(default_factory=dict)  # id of a guarded code -> the labs it serves
    originals: dict[int, types.CodeType] = field(default_factory=dict)  # id of a guarded code -> the original
    reference_code: set[int] = field(default_factory=set)  # ids of guarded codes and of their originals
    keep: list[types.CodeType] = field(default_factory=list)  # the codes those ids name, kept alive
    classes: dict[str, tuple[type, ...]] = field(default_factory=dict)  # lab -> its reference classes
    made: dict[int, Any] = field(default_factory=dict)  # id -> weak reference (or the id) of an object its class made
    selected: dict[str, set[str]] = field(default_factory=dict)  # module -> guarded qualnames
    ids: dict[str, dict[int, str]] = field(default_factory=dict)  # lab -> {id of a reference: its name}
    process_guards: bool = False
    # a reference kernel's function by (file, first line) -> (its name, its labs): to know a kernel made from it
    kernel_codes: dict[tuple[str, int], tuple[str, set[str]]] = field(default_factory=dict)


_state = _State()


def _refuse(text: str) -> EngineReference:
    FOUND.append(text)
    path = os.environ.get(FOUND_ENV)
    if path:
        try:
            with open(path, "a") as f:
                f.write(text.replace("\n", " ") + "\n")
        except OSError:
            pass
    return EngineReference(text)


def found_elsewhere() -> list[str]:
    """Refusals written to ``$MINISGL_AG_FOUND`` (by this test's other processes, and this one)."""
    path = os.environ.get(FOUND_ENV)
    try:
        return [line for line in Path(path).read_text().splitlines() if line] if path else []
    except OSError:
        return []


def _graded(filename: str, labs: set[str] | None) -> bool:
    """A file of the graded folder that is the file of one of ``labs`` (of any installed lab when
    None), or a helper of the student's that is no lab's file."""
    folder = _state.folder
    if folder is None or not filename.startswith(folder):
        return False
    name = filename[len(folder) :]
    if re.match(r"lab\d\d_", name) is None:
        return True
    return any(name == f"{_state.stems.get(lab)}.py" for lab in (_state.stems if labs is None else labs))


def _where(frame: types.FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}()"


def _asking(frame: types.FrameType | None, labs: set[str] | None) -> str | None:
    """Where graded code asks for this call, or None: the nearest frame from ``frame`` up that is
    graded code or reference code (the engine at work: a reference calling another) decides; past
    the last frame, the thread does (started by graded code or not)."""
    reference = _state.reference_code
    while frame is not None:
        code = frame.f_code
        if id(code) in reference:
            return None
        if _graded(code.co_filename, labs):
            return _where(frame)
        frame = frame.f_back
    started = getattr(threading.current_thread(), "_ag_started_by", None)
    if started is not None and (labs is None or started[0] & labs):
        return f"{started[1]} (a thread it started)"
    return None


def _guard(obj: Any = _NO_SELF) -> None:
    """The first statement of every guarded function (``obj``: a method's ``self``).

    A function, or a method called on an object that is not a reference class's, refuses when the
    nearest graded or reference frame above it is graded code (lab code that calls the engine's code
    that calls the reference is delegating too). A method of an object its own class made (the grader's
    or the engine's: lab code may not make one) refuses only a direct call from lab code: the grader may
    hand the lab an engine object that calls it (lab 05's context holds the grader's reference policy)."""
    frame = sys._getframe(1)
    labs = _state.code_labs.get(id(frame.f_code))
    name = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"
    if labs is None:  # the guard runs only inside the code install() compiled it into
        where = _asking(frame.f_back, None) or _where(frame)
        raise _refuse(
            f"the engine's own {name} runs as a copy of its code ({where}): the lab asks you to write it "
            "(graded 0 until then)"
        )
    own = obj is not _NO_SELF and _reference_object(obj, labs)
    if own and not _made_by_its_class(obj):
        raise _refuse(
            f"the engine's own {name} ran on an object the engine did not make ({_lab_line(obj)}: a "
            f"{type(obj).__qualname__} made with object.__new__ or by assigning __class__): the lab asks you to "
            "write the class (graded 0 until then)"
        )
    caller = frame.f_back
    if own:
        direct = caller is not None and _graded(caller.f_code.co_filename, labs)
        where = _where(caller) if direct else _asking(None, labs)
    else:
        where = _asking(caller, labs)
    if where is not None:
        raise _refuse(
            f"your code calls the engine's own {name} ({where}): the lab asks you to write it, not to delegate to "
            "the engine (graded 0 until then)"
        )


def _reference_object(obj: Any, labs: set[str]) -> bool:
    classes = tuple(c for lab in labs for c in _state.classes.get(lab, ()))
    return bool(classes) and issubclass(type(obj), classes)


def _made_by_its_class(obj: Any) -> bool:
    mark = _state.made.get(id(obj))
    return mark is not None and (mark is True or mark() is obj)


def _mark_made(obj: Any) -> None:
    """Remember ``obj`` by its id (hashing it may need fields ``__init__`` has not set yet), with a weak
    reference that forgets it when it dies; an object without weak references (``__slots__``) is
    remembered by id alone."""
    key = id(obj)
    try:
        _state.made[key] = weakref.ref(obj, lambda _, key=key: _state.made.pop(key, None))
    except TypeError:
        _state.made[key] = True


def _lab_line(obj: Any) -> str:
    """The line of a lab file that most likely made ``obj``: its class's, or the first ``__new__`` or
    ``__class__ =`` line of an installed lab's file."""
    cls = type(obj)
    module_file = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
    if _state.folder and module_file.startswith(_state.folder):
        try:
            return f"{Path(module_file).name}:{inspect.getsourcelines(cls)[1]}"
        except (OSError, TypeError):
            pass
    for stem in _state.stems.values():
        path = Path(_state.folder or "") / f"{stem}.py"
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines, 1):
            if re.search(r"__new__|__class__\s*=", line):
                return f"{path.name}:{i}"
    return "a lab file"


# ---- recompiling reference code with the guard first ----------------------------------------------------
def _chosen(qualname: str, selected: set[str]) -> bool:
    return any(qualname == s or qualname.startswith(s + ".") for s in selected)


class _InsertGuards(ast.NodeTransformer):
    """The guard call as the first statement (after a docstring) of each function whose qualname is
    selected (or nested in a selected one); a method passes its first argument."""

    def __init__(self, selected: set[str]):
        self.selected, self.scope = selected, []  # scope: (name, is a class) from the module down

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        self.scope.append((node.name, True))
        self.generic_visit(node)
        self.scope.pop()
        return node

    def _function(self, node):
        in_class = bool(self.scope) and self.scope[-1][1]
        qualname = ".".join(name for name, _ in self.scope) + ("." if self.scope else "") + node.name
        self.scope += [(node.name, False), ("<locals>", False)]
        self.generic_visit(node)
        del self.scope[-2:]
        if not _chosen(qualname, self.selected):
            return node
        decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
        args = node.args.posonlyargs + node.args.args
        method = in_class and args and not decorators & {"staticmethod", "classmethod"} and node.name != "__new__"
        call = ast.Call(ast.Name(_GUARD_NAME, ast.Load()), [ast.Name(args[0].arg, ast.Load())] if method else [], [])
        first = node.body[0]
        docstring = (
            isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
        )
        node.body.insert(1 if docstring else 0, ast.copy_location(ast.Expr(call), first))
        return node

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function


def _codes(code: types.CodeType) -> list[types.CodeType]:
    out = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out += _codes(const)
    return out


def _live_functions(module: types.ModuleType) -> list[types.FunctionType]:
    """The functions defined in ``module``'s file: module-level ones, the methods (and their static,
    class and property forms) of its classes and nested classes, and what decorators wrap."""
    filename = getattr(module, "__file__", None)
    out: list[types.FunctionType] = []
    seen: set[int] = set()

    def add(value: Any, depth: int = 0) -> None:
        if id(value) in seen or depth > 4:
            return
        seen.add(id(value))
        if isinstance(value, staticmethod | classmethod):
            add(value.__func__, depth + 1)
        elif isinstance(value, property):
            for f in (value.fget, value.fset, value.fdel):
                if f is not None:
                    add(f, depth + 1)
        elif isinstance(value, functools.cached_property):
            add(value.func, depth + 1)
        elif isinstance(value, types.FunctionType):
            if value.__code__.co_filename == filename:
                out.append(value)
            if getattr(value, "__wrapped__", None) is not None:
                add(value.__wrapped__, depth + 1)
        elif isinstance(value, type):
            if value.__module__ == module.__name__:
                for member in list(vars(value).values()):
                    add(member, depth + 1)
        elif callable(value) and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
            add(value.__wrapped__, depth + 1)  # functools.cache and other wrappers

    for value in list(vars(module).values()):
        add(value)
    return out


def _guard_module(module: types.ModuleType, qualnames: set[str], lab: str) -> None:
    """Recompile ``module``'s source with the guard in the functions ``qualnames`` select (each with its
    nested ones) and give the live functions the new code; the ones already guarded serve ``lab`` too."""
    done = _state.selected.setdefault(module.__name__, set())
    for fn in _live_functions(module):
        if id(fn.__code__) in _state.code_labs and _chosen(fn.__code__.co_qualname, qualnames):
            for code in _codes(fn.__code__):
                _state.code_labs.setdefault(id(code), set()).add(lab)
    new = qualnames - done
    if not new:
        return
    path = Path(module.__file__)
    source = path.read_text()
    tree = _InsertGuards(new).visit(ast.parse(source, str(path)))
    ast.fix_missing_locations(tree)
    if path.name.startswith("test_"):  # the grader's test modules keep pytest's assertion messages
        import builtins

        from _pytest.assertion import rewrite

        rewrite.rewrite_asserts(tree, source.encode(), str(path))
        vars(module).setdefault("@py_builtins", builtins)
        vars(module).setdefault("@pytest_ar", rewrite)
    compiled = compile(tree, str(path), "exec", dont_inherit=True)
    by_key = {(c.co_qualname, c.co_firstlineno): c for c in _codes(compiled)}
    setattr(module, _GUARD_NAME, _guard)
    for fn in _live_functions(module):
        old = fn.__code__
        if id(old) in _state.code_labs or not _chosen(old.co_qualname, new):
            continue
        code = by_key.get((old.co_qualname, old.co_firstlineno))
        if code is None or code.co_freevars != old.co_freevars:
            continue  # made at run time from another code object: its maker is guarded
        fn.__code__ = code
        _state.originals[id(code)] = old
        for c in _codes(code):
            _state.code_labs.setdefault(id(c), set()).add(lab)
        for c in _codes(code) + _codes(old):
            _state.reference_code.add(id(c))
            _state.keep.append(c)
    for name in new:
        if _kernel(vars(module).get(name)):
            _guard_kernel(vars(module)[name], f"{module.__name__}.{name}", lab)
    done |= new


def _kernel(value: Any) -> bool:
    """A Triton kernel (``@triton.jit``: compiled from its source, so its code is not what runs on a GPU)."""
    return hasattr(value, "fn") and hasattr(value, "run") and hasattr(value, "__getitem__")


def _guard_kernel(kernel: Any, name: str, lab: str) -> None:
    """Its launches (``kernel[grid](...)`` calls ``kernel.run``) refuse lab code, as a guarded function does; so
    do those of another kernel object made from its function (``triton.jit(kernel.fn)``, or a function made
    from its code: Triton compiles, and its interpreter rewrites, the function's source, never the guarded
    code)."""
    real, labs = kernel.run, {lab}

    def run(*args, **kwargs):
        where = _asking(sys._getframe(1), labs)
        if where is not None:
            raise _refuse(
                f"your code launches the engine's own kernel {name} ({where}): the lab asks you to write it "
                "(graded 0 until then)"
            )
        return real(*args, **kwargs)

    kernel.run = run
    code = getattr(getattr(kernel, "fn", None), "__code__", None)
    if code is not None:
        _state.kernel_codes.setdefault((code.co_filename, code.co_firstlineno), (name, set()))[1].add(lab)
        _guard_kernel_class(type(kernel))


def _guard_kernel_class(cls: type) -> None:
    """Every launch of a kernel of ``cls`` (Triton's JITFunction, or its interpreter's function) whose function
    has a reference kernel's code refuses lab code (a reference kernel's own ``run`` is guarded already)."""
    if "_ag_guarded_run" in vars(cls):
        return
    real = cls.run

    def run(self, *args, **kwargs):
        code = getattr(getattr(self, "fn", None), "__code__", None)
        found = _state.kernel_codes.get((code.co_filename, code.co_firstlineno)) if code is not None else None
        if found is not None:
            where = _asking(sys._getframe(1), found[1])
            if where is not None:
                raise _refuse(
                    f"your code launches a copy of the engine's own kernel {found[0]} ({where}): the lab asks you "
                    "to write it (graded 0 until then)"
                )
        return real(self, *args, **kwargs)

    cls.run = run
    cls._ag_guarded_run = True


def _module_and_names(dotted: str, refs: set[str] = frozenset()) -> tuple[types.ModuleType, set[str]] | None:
    """The module of a reference and the qualnames it guards there: the reference itself and the
    module's private helpers (``_name``) that only references use (not those a public function or
    class of the module, or its module-level code, reaches: those serve the engine's other parts and
    the labs too). ``"module:"`` (nothing after the colon) guards every class and function defined in a
    module of the grader's (its reference helpers) but the tests (``test_*``) and pytest's hooks. None
    for a grader's module that is not there (the hidden tests, in the student edition)."""
    module_name, _, qualname = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        if not qualname and module_name.startswith("autograder."):
            return None
        raise
    defined = {
        name
        for name, value in vars(module).items()
        if getattr(value, "__module__", None) == module_name
        and isinstance(value, type | types.FunctionType)
        or _kernel(value)
        and getattr(value.fn, "__module__", None) == module_name
    }
    if not qualname:  # the grader's helper functions (its classes are handed to lab code: fakes, recorders)
        helpers = {n for n in defined if isinstance(vars(module)[n], types.FunctionType)}
        return module, {n for n in helpers if not n.startswith(("test_", "pytest_", "__"))}
    private = {n for n in defined if n.startswith("_") and not n.startswith("__")}
    return module, {qualname} | (private - _shared(module, refs))


@functools.cache
def _uses(path: str) -> tuple[dict[str, set[str]], frozenset[str]]:
    """Per top-level function or class of the file, the names it uses; and the names its module-level
    code (outside any def or class) uses."""
    tree = ast.parse(Path(path).read_text())
    uses: dict[str, set[str]] = {}
    top: set[str] = set()
    for node in tree.body:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            uses[node.name] = names
        else:
            top |= names
    return uses, frozenset(top)


def _shared(module: types.ModuleType, refs: set[str]) -> set[str]:
    """The private names of ``module`` that its public names other than ``refs`` (the lab's references
    there), or its module-level code, reach (through each other)."""
    uses, top = _uses(module.__file__)
    todo = [n for n in uses if not n.startswith("_") and n not in refs] + [n for n in top if n.startswith("_")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n for n in uses.get(name, ()) if n.startswith("_") and n not in seen]
    return seen


def _resolve(dotted: str) -> Any:
    module, _, qualname = dotted.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split(".") if qualname else []:
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj


def references(lab: str) -> dict[int, str]:
    """``{id(obj): "module:qualname"}`` of the lab's named references: classes, functions, and the
    functions of each reference class's own methods."""
    if lab in _state.ids:
        return _state.ids[lab]
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
    """The reference without its guard, as a new function (``fn`` itself if it has none): for the
    grader's own use of the engine inside the lab module (lab 12 grades ``latency_metrics`` with the
    reference helpers in place of the student's)."""
    code = getattr(fn, "__code__", None)
    old = _state.originals.get(id(code))
    if old is None:
        return fn
    copy = types.FunctionType(old, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
    return copy


# ---- reference classes count what they make ---------------------------------------------------------------
def _count_instances(classes: tuple[type, ...]) -> None:
    """Each class makes its instances through a ``__new__`` that remembers them (and refuses when lab
    code asks); the instances alive now were made before any lab code ran."""
    for cls in classes:
        if "_ag_counting" in vars(cls):
            continue
        base_new = cls.__new__

        def counting_new(klass, *args, _base=base_new, _name=cls.__qualname__, **kwargs):
            where = _asking(sys._getframe(1), None)
            if where is not None:
                raise _refuse(
                    f"your code makes an instance of the engine's own {_name} ({where}): the lab asks you to write "
                    "it (graded 0 until then)"
                )
            obj = _base(klass) if _base is object.__new__ else _base(klass, *args, **kwargs)
            _mark_made(obj)
            return obj

        cls.__new__ = staticmethod(counting_new)
        cls._ag_counting = True
    if classes:
        for obj in gc.get_objects():
            if issubclass(type(obj), classes):
                _mark_made(obj)


# ---- library shortcuts, loaders, processes and threads -------------------------------------------------------
_SHORTCUT = "your code calls {what} ({where}), which the lab's docstring rules out: the lab asks you to write it"
_LOADER = (
    "your build compiles or loads the engine's own C++ ({reason}: {what} at {where}): the lab asks you to write "
    "the kernel, not to build minisgl/kernels/csrc"
)


def _watch(dotted: str, labs: set[str], why: Any = None, message: str = _SHORTCUT) -> None:
    """Replace ``module:attr`` by a function that, when lab code of ``labs`` calls it, refuses if
    ``why(args, kwargs)`` gives a reason (always, for ``why`` None)."""
    module_name, _, attr = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
        real = getattr(module, attr)
    except (ImportError, AttributeError):
        return
    if getattr(real, "_ag_watched", None) is not None:
        real._ag_watched.update(labs)
        return
    watched_labs = set(labs)

    def watched(*args, **kwargs):
        where = _asking(sys._getframe(1), watched_labs)
        reason = (why(args, kwargs) if why is not None else "forbidden") if where is not None else None
        if reason:
            text = message.format(what=f"{module_name}.{attr}", where=where, reason=reason)
            raise _refuse(f"{text} (graded 0 until then)")
        return real(*args, **kwargs)

    watched._ag_watched = watched_labs
    watched.__name__ = getattr(real, "__name__", attr)
    watched.__qualname__ = getattr(real, "__qualname__", attr)
    watched.__doc__ = getattr(real, "__doc__", None)
    setattr(module, attr, watched)


def _program(argv: Any) -> str:
    """The name of the program ``argv`` (a list, or a shell command line) runs."""
    if isinstance(argv, str | bytes | os.PathLike):
        first = os.fsdecode(argv).split()[0] if os.fsdecode(argv).split() else ""
    else:
        first = os.fsdecode(next(iter(argv), ""))
    return Path(first).name


def _install_process_guards() -> None:
    """Lab code may start no process but the C++ toolchain (tvm_ffi's ninja and compiler); a thread it
    starts counts as lab code."""
    if _state.process_guards:
        return
    _state.process_guards = True
    import _posixsubprocess
    import multiprocessing.process
    import subprocess

    def guard(owner: Any, name: str, program: Any) -> None:
        real = getattr(owner, name, None)
        if real is None:
            return

        def guarded(*args, **kwargs):
            where = _asking(sys._getframe(1), None)
            what = program(args, kwargs) if program is not None else None
            if where is not None and what not in TOOLCHAIN:
                raise _refuse(
                    f"your code starts a process ({what or f'{owner.__name__}.{name}'}, at {where}): a lab runs in "
                    "the grader's process, where the engine's reference code is guarded (graded 0 until then)"
                )
            return real(*args, **kwargs)

        setattr(owner, name, guarded)

    guard(subprocess.Popen, "__init__", lambda a, k: _program(a[1] if len(a) > 1 else k.get("args", "")))
    guard(_posixsubprocess, "fork_exec", lambda a, k: _program(a[0]))
    guard(os, "system", lambda a, k: _program(a[0]))
    for name in ("posix_spawn", "posix_spawnp", "execv", "execve", "execvp", "execvpe", "execl", "execlp"):
        guard(os, name, lambda a, k: _program(a[0]))
    for name in ("spawnv", "spawnve", "spawnvp", "spawnvpe"):
        guard(os, name, lambda a, k: _program(a[1]))
    guard(multiprocessing.process.BaseProcess, "start", None)
    thread_start = threading.Thread.start

    def start(self):
        frame = sys._getframe(1)
        labs = {lab for lab in _state.stems if _asking(frame, {lab}) is not None}
        if labs:
            self._ag_started_by = (labs, _asking(frame, None))
        return thread_start(self)

    threading.Thread.start = start


# ---- install -------------------------------------------------------------------------------------------------------
def _grader_modules(stem: str) -> tuple[str, ...]:
    """The grader's test modules of a lab, whose helpers compute the reference answers."""
    return (f"autograder.test_{stem}:", f"autograder.hidden.test_{stem}:")


def install(stem: str, graded_folder: Path) -> None:
    """Guard the lab's references in this process (and the processes it forks); every later process
    that loads a lab file does the same (``impl.load``, from ``$MINISGL_AG_GUARD``). Calls from another
    lab's file are not refused (a plain ``pytest autograder`` collects several labs, and lab 08's loop
    runs the engine's lab 07 policy through the scheduler)."""
    lab = lab_of_stem(stem)
    if lab in _state.stems or lab not in LABS:
        return
    os.environ[GUARD_ENV] = "1"
    _state.folder = str(graded_folder.resolve()) + os.sep
    _state.stems[lab] = stem
    refs = LABS[lab]
    by_module: dict[str, tuple[types.ModuleType, set[str]]] = {}
    classes: list[type] = []
    here: dict[str, set[str]] = {}  # module -> the top-level names of the lab's references there
    for dotted in refs.engine:
        module_name, _, qualname = dotted.partition(":")
        here.setdefault(module_name, set()).add(qualname.split(".")[0])
    for dotted in (*refs.engine, *_grader_modules(stem)):
        found = _module_and_names(dotted, here.get(dotted.partition(":")[0], set()))
        if found is None:
            continue
        module, names = found
        by_module.setdefault(module.__name__, (module, set()))[1].update(names)
        if not dotted.endswith(":") and isinstance(obj := _resolve(dotted), type):
            classes.append(obj)
    for module, names in by_module.values():
        for name in names:
            value = vars(module).get(name)
            if isinstance(value, type) and value not in classes and not inspect.isabstract(value):
                classes.append(value)
        _guard_module(module, names, lab)
    # the classes that make their objects with object.__new__ (not tuples, enums, exceptions) count them
    classes = [c for c in classes if c.__new__ is object.__new__ or "_ag_counting" in vars(c)]
    _state.classes[lab] = tuple(classes)
    _count_instances(tuple(classes))
    for dotted in refs.shortcuts:
        _watch(dotted, {lab})
    check = _resolve(refs.loader_check) if refs.loader_check else None
    for dotted in refs.loaders:
        _watch(dotted, {lab}, check, _LOADER)
    _install_process_guards()
    _state.ids[lab] = references(lab)


def installed(stem: str) -> bool:
    return lab_of_stem(stem) in _state.stems


# ---- what the grader takes from the lab ---------------------------------------------------------------------
def _unwrap(obj: Any) -> Any:
    while True:
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif getattr(obj, "__wrapped__", None) is not None:
            obj = obj.__wrapped__
        else:
            return obj


def _guarded_code(fn: Any) -> bool:
    return id(getattr(fn, "__code__", None)) in _state.reference_code


def check_object(stem: str, attr: str, obj: Any, lab_file: Path) -> None:
    """Raise ``EngineReference`` if ``obj`` (the lab file's ``attr``) is, derives from or wraps the
    engine's implementation of the lab's component, runs its code, leaves one of its own methods to
    another file, or makes its instances itself (``__new__``)."""
    lab = lab_of_stem(stem)
    refs = references(lab)
    if not refs and lab not in LABS:
        return
    at = _line(lab_file, attr)
    where = f"{lab_file.name}'s {attr} ({at})"
    if isinstance(obj, type):
        for base in obj.__mro__:
            if id(base) in refs:
                what = "is" if base is obj else "derives from"
                raise _refuse(
                    f"{where} {what} the engine's own {refs[id(base)]}: the lab asks you to write it. Derive from the "
                    "interface only and write the methods in your lab file (graded 0 until then)"
                )
        new = _function(inspect.getattr_static(obj, "__new__", None))
        if new is not None and Path(new.__code__.co_filename).resolve() == lab_file.resolve():
            raise _refuse(
                f"{lab_file.name}'s {attr} defines __new__ ({lab_file.name}:{new.__code__.co_firstlineno}): the grader "
                "makes your "
                "objects itself, and an object of the engine's class handed out this way is the engine's answer "
                "(graded 0 until then)"
            )
        for name in LABS[lab].own.get(attr, ()):
            fn = _function(inspect.getattr_static(obj, name, None))
            fn = _unwrap(fn) if fn is not None else None
            if fn is None or Path(fn.__code__.co_filename).resolve() != lab_file.resolve() or _guarded_code(fn):
                source = "nowhere" if fn is None else f"{fn.__module__}.{fn.__qualname__}"
                raise _refuse(
                    f"{lab_file.name}'s {attr}.{name} is not written in {lab_file.name} (the class: {at}; the method "
                    f"comes from {source}): the lab asks you to write {attr}.{name} yourself (graded 0 until then)"
                )
        return
    target = _unwrap(obj)
    name = refs.get(id(target)) or refs.get(id(obj))
    if name is None and _guarded_code(target):
        name = f"{target.__module__}.{target.__qualname__} (its code under another function object)"
    if name is not None:
        raise _refuse(f"{where} is the engine's own {name}: the lab asks you to write it (graded 0 until then)")
    if not (inspect.isfunction(obj) or inspect.ismodule(obj) or isinstance(obj, functools.partial)):
        check_instance(stem, attr, obj, lab_file)
        if is_dataclass(obj):  # an object holding the lab's classes (lab 11's TextStreams)
            for f in fields(obj):
                value = getattr(obj, f.name)
                if isinstance(value, type) or callable(value):
                    check_object(stem, f"{attr}.{f.name}", value, lab_file)


def _line(lab_file: Path, attr: str) -> str:
    """``lab file:line`` where the lab file defines or assigns ``attr`` (the first part of a dotted one),
    else the file's name."""
    name = re.escape(attr.split(".")[0])
    try:
        lines = lab_file.read_text().splitlines()
    except OSError:
        return lab_file.name
    for i, text in enumerate(lines, 1):
        if re.match(rf"\s*(?:(?:async\s+)?def|class)\s+{name}\b|\s*{name}\s*(?::[^=]*)?=[^=]", text):
            return f"{lab_file.name}:{i}"
    return lab_file.name


def check_instance(stem: str, what: str, obj: Any, lab_file: Path) -> Any:
    """``obj`` (made by the lab's ``what``), unless it is an instance of a reference class (raises
    ``EngineReference``)."""
    refs = references(lab_of_stem(stem))
    for base in type(obj).__mro__:
        if id(base) in refs:
            raise _refuse(
                f"{lab_file.name}'s {what} gave an instance of {type(obj).__qualname__}, which "
                f"{'is' if base is type(obj) else 'derives from'} the engine's own {refs[id(base)]} "
                f"({_lab_line(obj)}): the lab asks you to write the class (graded 0 until then)"
            )
    return obj
