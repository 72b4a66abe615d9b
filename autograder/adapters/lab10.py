"""Lab 10 adapter: the layer classes of ``lab10_tensor_parallel.py`` and its ``LAB10_LAYERS``, used
only through the engine's constructors, parameters and ``weight_loader``s (the ``TPLayers`` seam of
``minisgl/layers/__init__.py``), and the swap-in that lets the real engine run on them.

The other tensor-parallel ranks are *spawned* processes: they do not see what this process
registered. So the engine is handed the layer set by path, ``components={"tp_layers":
ENGINE_NAME}``: every rank imports this module and reads ``LAB10_LAYERS`` from it, which loads the
graded lab file (``$MINISGL_LAB_IMPL``, inherited) in that rank."""

from __future__ import annotations

from autograder.impl import require
from minisgl.layers import TPLayers

STEM = "lab10_tensor_parallel"
ENGINE_NAME = f"{__name__}:LAB10_LAYERS"  # a "module:attr" name TP_LAYERS imports in every rank
CLASSES = ("ColumnParallelLinear", "MergedColumnParallelLinear", "QKVParallelLinear", "RowParallelLinear")
CLASSES += ("VocabParallelEmbedding", "ParallelLMHead")


def layer(name: str) -> type:
    """One of the lab's layer classes, by the engine's name for it (``CLASSES``)."""
    if name not in CLASSES:
        raise ValueError(f"unknown lab 10 layer {name!r}; one of {CLASSES}")
    cls = require(STEM, name)
    if not isinstance(cls, type):
        raise TypeError(f"{name} must be a class (an nn.Module with the engine's constructor)")
    return cls


def layers() -> TPLayers:
    """The lab's ``LAB10_LAYERS``: the set of classes the engine builds its decoder from."""
    tp = require(STEM, "LAB10_LAYERS")
    if not isinstance(tp, TPLayers):
        raise TypeError("LAB10_LAYERS must be a minisgl.layers.TPLayers of the lab's classes")
    return tp


def __getattr__(name: str):  # ENGINE_NAME, looked up in each rank (a module attribute computed on access)
    if name == "LAB10_LAYERS":
        return layers()
    raise AttributeError(name)
