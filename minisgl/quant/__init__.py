"""Number formats, applied to a loaded model: the one place the engine's code meets quantization.

A weight format (``--quantization NAME``, registered in ``QUANTIZATIONS``) rewrites the loaded model in
place: it replaces each linear layer it quantizes by its quantized form, and may replace the layers
around it by forms that hand over or take that layer's half-done values (``fp8.py``). The decoder and
the layers it is built from never name a format. A KV-cache format is a property of the pool
(``kvcache/pool.py``: it stores a narrower dtype and scales); :func:`calibrate_kv` sets its scales
at load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from minisgl.registry import Registry

logger = logging.getLogger(__name__)

Quantize = Callable[[nn.Module], str]
"""``quantize(model) -> what it did, in words`` (logged); rewrites ``model`` in place."""

QUANTIZATIONS: Registry[Quantize] = Registry(
    "quantization",
    {
        "fp8": "minisgl.quant.fp8:apply",
        "int8": "minisgl.quant.cpu_int:apply_int8",
        "int4": "minisgl.quant.cpu_int:apply_int4",
        "auto": "minisgl.quant.cpu_int:apply_auto",
    },
)


def quantize(model: nn.Module, name: str) -> None:
    """Apply the weight format ``name`` to a loaded ``model``."""
    logger.info("%s weights: %s", name, QUANTIZATIONS.get(name)(model))


def calibrate_kv(engine, tokenizer) -> None:
    """The scales of ``engine``'s quantized KV pool, from one prefill of a fixed text (``kv_calibrate.py``)."""
    from minisgl.quant.kv_calibrate import calibrate_kv_scales, calibration_ids

    cfg = engine.model_config
    calibrate_kv_scales(engine, calibration_ids(tokenizer, cfg.vocab_size, engine.max_seq_len))
