"""The engine: builds model, KV pool, page table, attention backend, sampler and CUDA graphs, and
runs one batch forward (``forward_batch``). It knows nothing of requests' lifetimes; that is the
scheduler's job."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import threading
from collections.abc import Callable

import torch

from minisgl.attention import create_backend
from minisgl.attention.context import forward_context
from minisgl.core import Batch
from minisgl.distributed import get_tp_info, init_distributed
from minisgl.engine.config import EngineConfig
from minisgl.engine.graph import GRAPH_PLANS, GraphRunner, capture_sizes
from minisgl.engine.sample import SAMPLERS, SamplingInfo
from minisgl.feature import SampleHooks
from minisgl.kernels.jit import CpuKernels, choose, cpu_module, use
from minisgl.kvcache import REQ_TABLES, KVPool
from minisgl.layers import LayerImpls
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.models.resolve import resolve_model
from minisgl.models.weights import init_dummy_weights, load_weights, pack_on_huge_pages
from minisgl.quant import calibrate_kv, quantize
from minisgl.tokenizer import load_tokenizer
from minisgl.utils import keep_freed_memory, nvtx_range

logger = logging.getLogger(__name__)
atexit.register(gc.unfreeze)  # see the end of Engine.__init__

CPU_KV_BUDGET_BYTES = 1 << 30  # the CPU default pool: 1 GiB of KV...
CPU_KV_MAX_TOKENS = 1 << 16  # ...and at most 64k tokens


class Engine:
    def __init__(self, config: EngineConfig, check_peers: Callable[[], None] | None = None):
        """``check_peers``: with ``tp_size > 1``, raises when another rank died while this one
        waits for the group to form (``init_distributed``)."""
        self.config = config
        self.device = config.torch_device
        self.dtype = config.torch_dtype
        parts = config.components
        self.model_path, self.model_config = resolve_model(config.model, config.dummy_weight)
        self.model_config.check_tp_size(config.tp_size)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        init_distributed(
            config.tp_rank, config.tp_size, self.device, config.dist_init_method, parts.communicator, check_peers
        )
        self.tp = get_tp_info()
        if self.device.type == "cpu":  # the C++ kernels compile (once per machine) while the weights load
            threading.Thread(target=cpu_module, name="build-cpu-kernels", daemon=True).start()
            keep_freed_memory()
        self.model = self._load_model()
        attn = self.model.model.layers[0].self_attn
        self.local_heads, self.local_kv_heads = attn.num_heads, attn.num_kv_heads  # this rank's share
        cfg = self.model_config
        self.max_seq_len = min(cfg.max_position, config.max_seq_len or cfg.max_position)
        self.num_pages = self._num_pages()
        self.kv_pool = KVPool(
            cfg.num_layers,
            self.num_pages,
            config.page_size,
            self.local_kv_heads,
            cfg.head_dim,
            config.torch_kv_dtype,
            self.device,
            compute_dtype=self.dtype,
        )
        self.max_running = config.max_running_requests
        self.table = REQ_TABLES.get(parts.req_table)(self.max_running, self.max_seq_len, config.page_size, self.device)
        self.attn_backend = create_backend(
            config.attention_backend, self.kv_pool, self.table, self.local_heads, cfg.head_dim
        )
        self.tokenizer = None  # loaded here only for the calibration text; the LLM then takes this one
        if self.kv_pool.quantized:  # per-head scales from one prefill of a real text, before any graph
            self.tokenizer = load_tokenizer(self.model_path)
            calibrate_kv(self, self.tokenizer)
        self.sampler = SAMPLERS.get(parts.sampler)()
        self.graph_runner = None
        if self.device.type == "cuda":
            plan = GRAPH_PLANS.get(parts.graph_plan)()
            logits_bytes = lambda bs: bs * cfg.vocab_size * self.dtype.itemsize  # what each graph keeps
            rows = self.max_running * config.decode_rows_per_request
            sizes = capture_sizes(config.cuda_graph_max_bs, self.device, rows, self.attn_backend, plan, logits_bytes)
            if sizes:
                self.graph_runner = GraphRunner(self.model, self.attn_backend, self.kv_pool, self.table, sizes, plan)
            self._compile_sampler()
        # Everything made so far (modules, parameters) lives as long as the engine: moved out of the
        # collector's generations, the collections that serving's short-lived objects trigger no longer
        # walk it (0.52 -> 0.23 s of collections in the CPU batch benchmark's process). shutdown() and
        # the interpreter's exit put it back, so an engine dropped in a process that makes several (the
        # tests) can still be collected, and nothing frozen is left for the exit's leak checks (nanobind).
        gc.freeze()

    def _load_model(self) -> DecoderForCausalLM:
        c = self.config.components
        impls = LayerImpls.by_name(c.norm, c.rotary, c.activation, c.tp_layers)
        model = DecoderForCausalLM.build(self.model_config, impls, self.dtype, self.device)
        if self.config.dummy_weight or self.model_path is None:
            init_dummy_weights(model, seed=self.config.seed)
        else:
            load_weights(model, self.model_path)
        if self.config.quantization is not None:
            quantize(model, self.config.quantization)
        if self.device.type == "cpu":
            pack_on_huge_pages(model)
        return model.eval()

    def _num_pages(self) -> int:
        cfg, page = self.model_config, self.config.page_size
        if self.config.num_pages is not None:
            return self.config.num_pages
        kv_dtype = self.config.torch_kv_dtype
        per_token = KVPool.bytes_per_token(cfg.num_layers, self.local_kv_heads, cfg.head_dim, kv_dtype)
        if self.config.mem_fraction_static is not None:
            tokens = self._static_share_tokens(per_token)
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            tokens = int(free * self.config.memory_ratio) // per_token
        else:
            tokens = min(CPU_KV_BUDGET_BYTES // per_token, CPU_KV_MAX_TOKENS)
        if self.device.type == "cuda" and self.tp.size > 1:  # every rank must plan with the same pool size
            t = torch.tensor([tokens], device=self.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
            tokens = int(t.item())
        pages = max(1, tokens // page)
        logger.info(
            "KV pool: %d tokens in %d pages of %d, %.2f GiB (%s)",
            pages * page,
            pages,
            page,
            pages * page * per_token / 2**30,
            kv_dtype,
        )
        return pages

    def _static_share_tokens(self, per_token: int) -> int:
        """SGLang's ``mem_fraction_static`` F: the weights (this rank's) and the KV pool together take F of
        the device's memory (a GPU's total, else the machine's RAM); the pool gets what the weights leave."""
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
        else:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        weights = sum(t.numel() * t.element_size() for t in [*self.model.parameters(), *self.model.buffers()])
        share = int(total * self.config.mem_fraction_static)
        if share - weights < per_token * self.config.page_size:
            raise ValueError(
                f"mem_fraction_static {self.config.mem_fraction_static:g} is {share / 2**30:.2f} GiB of "
                f"{total / 2**30:.2f} GiB, and the weights alone take {weights / 2**30:.2f} GiB: no room for a KV pool"
            )
        logger.info(
            "mem_fraction_static %g: %.2f GiB of %.2f GiB; weights %.2f GiB, KV pool the rest",
            self.config.mem_fraction_static,
            share / 2**30,
            total / 2**30,
            weights / 2**30,
        )
        return (share - weights) // per_token

    def _compile_sampler(self) -> None:
        """Sample once from dummy logits so the sampler's JIT kernels compile now, at start-up, and not
        inside the first request that asks for a temperature (about a second with Triton)."""
        vocab = self.model_config.vocab_size
        info = SamplingInfo.plain(1, 1.0, vocab, self.device)
        self.sampler.sample(torch.zeros(1, vocab, dtype=self.dtype, device=self.device), info)

    @functools.cached_property
    def cpu_kernels(self) -> CpuKernels | None:
        """The C++ kernels this engine's layers run, chosen once, at its first pass (after the build that
        its start began; ``wait_built`` may say that it waits for it), for the level in use then; None on a GPU."""
        return choose() if self.device.type == "cpu" else None

    @torch.inference_mode()
    def forward_batch(self, batch: Batch, info: SamplingInfo, hooks: SampleHooks | None = None) -> torch.Tensor:
        """Run the model on ``batch`` and sample: next token ids ``[batch.size]`` on the device.
        ``hooks``: what the batch's requests ask for besides their tokens (``minisgl/feature.py``)."""
        every = hooks is not None and hooks.needs_hidden  # the hidden states of every position
        with forward_context(batch, self.attn_backend), use(self.cpu_kernels):
            if self.graph_runner is not None and self.graph_runner.can_run(batch) and not every:
                logits = self.graph_runner.replay(batch)
            else:
                self.attn_backend.prepare_metadata(batch)
                if every:
                    hidden = self.model.model(batch.input_ids, batch.positions)
                    logits = self.model.lm_head(hidden[batch.logit_idx])
                    hooks.on_hidden(hidden, self.model.lm_head)
                else:
                    logits = self.model(batch.input_ids, batch.positions, batch.logit_idx)
        logits = logits[: batch.size]
        if hooks is not None:
            hooks.on_logits(logits)
        with nvtx_range("sample"):
            tokens = self.sampler.sample(logits, info)
        if hooks is not None:
            hooks.on_tokens(tokens)
        return tokens

    def shutdown(self) -> None:
        from minisgl.distributed import destroy_distributed

        if self.graph_runner is not None:
            # NCCL (>= 2.26) destroys a communicator only once every graph that captured its
            # collectives is gone: release the graphs first, or destroy_process_group() waits forever
            torch.cuda.synchronize(self.device)
            self.graph_runner.graphs.clear()
            self.graph_runner = None
        if self.tp.size > 1:
            destroy_distributed()
        gc.unfreeze()
