"""The engine's real execution backend: each batch the policy decides runs on the device, and the engine
advances by the measured wall time instead of the cost model's price.

The engine, policy and KV accounting are the simulator's own (simcore.engine.Engine with `executor=`),
so a real run and a simulated run differ only in how long each step takes. Physical KV blocks mirror
the engine's counted pool one for one (same number of blocks; a request never holds more physical
blocks than the engine counts for it). Time: in a `simpy.rt.RealtimeEnvironment` the simulated clock
follows the wall clock, so requests arrive in real time; a step's duration is the wall time from the
end of the previous step (scheduling and bookkeeping included, as in a real engine) to the end of
this one's forward pass. Ignores: swap transfers (a swapped request keeps its KV in place; the engine
prices the copy), CUDA graphs, asynchronous scheduling.
"""
from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import simpy
import torch

from calibration.model import Decoder, PagedKVCache, SeqGroup, StepInput, random_weights
from costmodels.catalog import ModelShape
from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.request import RequestSpec, Status

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAD_TOKEN = 0


class BackendError(RuntimeError):
    """The real backend and the engine's bookkeeping disagree (a bug in one of them): fail loudly."""


def reference_kernel_s(device: str, reps: int = 3) -> float:
    """Median time of a fixed matmul: the machine's speed index (512^3 fp32 on CPU, 4096^3 bf16 on GPU).
    Ratios of this number between two moments say how much faster or slower the device is running."""
    n, dtype = (512, torch.float32) if device == "cpu" else (4096, torch.bfloat16)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass
class SeqState:
    """Backend-side state of one request: its token ids and where its KV lives."""
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_physical: int = 0  # tokens whose K/V sit in the cache (padded rows hold their padding too)


@dataclass(frozen=True)
class StepRecord:
    """One real iteration. `measured_s` is what the engine advanced by = `sched_s` (scheduling and
    bookkeeping since the previous step) + `forward_s` (input preparation, forward pass, sampling,
    device sync). `speed_ratio`: latest reference-kernel time / the run's baseline (> 1: slower)."""
    start_s: float
    kind: str                 # prefill_only | decode_only | mixed
    num_seqs: int
    num_prefill_seqs: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_decode_ctx_tokens: int
    num_logits: int
    is_padded: bool
    measured_s: float
    sched_s: float
    forward_s: float
    minor_faults: int
    speed_ratio: float


def batch_kind(prefill, decode) -> str:
    if prefill and decode:
        return "mixed"
    return "prefill_only" if prefill else "decode_only"


class RealBackend:
    """An engine executor (see `simcore.engine.Engine`): `execute(engine, batch, shape, cost_args)`
    runs the batch and returns seconds. One backend serves one engine run at a time; `reset()` between."""

    def __init__(self, shape: ModelShape, num_blocks: int, block_size: int, device: str = "cpu",
                 dtype: str = "fp32", seed: int = 0, reference_every_s: float = 2.0,
                 reference_base_s: float | None = None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError("device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
        self.shape, self.device, self.block_size, self.seed = shape, device, block_size, seed
        self.decoder = Decoder(random_weights(shape, device, DTYPES[dtype], seed))
        self.cache = PagedKVCache(shape, num_blocks, block_size, device, DTYPES[dtype])
        self.reference_every_s = reference_every_s
        self.reference_base_s = reference_base_s or reference_kernel_s(device)
        self.reset()

    def reset(self) -> None:
        """Forget all requests and logs (the KV memory itself is reused)."""
        self.seqs: dict[int, SeqState] = {}
        self.outputs: dict[int, list[int]] = {}  # request id -> prompt + generated token ids
        self.free_blocks = list(range(self.cache.num_blocks - 1, -1, -1))
        self.records: list[StepRecord] = []
        self.cost_args: list[dict] = []       # the engine's pricing arguments, per record
        self.speed_samples: list[tuple[float, float]] = []  # (sim time, reference kernel seconds)
        self._last_reference_wall = -float("inf")
        self._speed_ratio = 1.0

    # ---- the executor protocol ----
    def execute(self, engine, batch, shape, cost_args: dict) -> float:
        env = engine.env
        sched_s = self._time_since_clock(env)
        self._maybe_time_reference(env)
        t0 = time.perf_counter()
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self._reconcile(engine)
        rows = self._rows(engine, batch, shape)
        step = self._prepare(rows, engine, batch)
        next_tokens = self.decoder.forward(step, self.cache).tolist()  # .tolist() syncs the device
        self._apply(rows, next_tokens)
        forward_s = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        prefill, decode = cost_args["prefill"], cost_args["decode"]
        self.records.append(StepRecord(
            env.now, batch_kind(prefill, decode), len(shape), len(prefill), sum(n for n, _ in prefill),
            len(decode), sum(decode), len(next_tokens), batch.padded_shape is not None,
            sched_s + forward_s, sched_s, forward_s, faults, self._speed_ratio))
        self.cost_args.append(cost_args)
        return sched_s + forward_s

    def _time_since_clock(self, env) -> float:
        """Wall time since the moment the simulated clock stands at (real-time environments only)."""
        if not hasattr(env, "real_start"):
            return 0.0
        return max(0.0, time.monotonic() - (env.real_start + (env.now - env.env_start) * env.factor))

    def _maybe_time_reference(self, env) -> None:
        now = time.monotonic()
        if now - self._last_reference_wall < self.reference_every_s:
            return
        ref_s = reference_kernel_s(self.device)
        self._speed_ratio = ref_s / self.reference_base_s
        self.speed_samples.append((env.now, ref_s))
        self._last_reference_wall = time.monotonic()
        if hasattr(env, "real_start"):  # the probe is not part of the workload: hide it from the clock
            env.real_start += self._last_reference_wall - now

    # ---- keeping physical KV in step with the engine ----
    def _reconcile(self, engine) -> None:
        """Free the KV of requests the engine finished, and drop it for recompute-preempted ones."""
        for rid in list(self.seqs):
            req = engine.requests[rid]
            state = self.seqs[rid]
            if req.status in (Status.FINISHED, Status.REJECTED):
                self._free(state)
                del self.seqs[rid]
            elif req.num_computed_tokens == 0 and state.num_physical > 0 and req.status is Status.WAITING:
                self._free(state)  # recompute: its prompt and generated tokens are computed again

    def _free(self, state: SeqState) -> None:
        self.free_blocks.extend(reversed(state.block_table))
        state.block_table, state.num_physical = [], 0

    def _state(self, req) -> SeqState:
        state = self.seqs.get(req.request_id)
        if state is None:
            rng = np.random.default_rng([self.seed, req.request_id])
            prompt = rng.integers(1, self.shape.vocab_size, size=req.num_prompt_tokens).tolist()
            state = self.seqs[req.request_id] = SeqState(prompt)
            self.outputs[req.request_id] = state.token_ids
        return state

    def _rows(self, engine, batch, shape) -> list[tuple]:
        """(request, state, new tokens, physical context before, samples?) per forward row."""
        reqs = engine.requests
        if batch.padded_shape is None:
            rows = []
            for s, (n, _) in zip(batch.scheduled, shape):
                req = reqs[s.request_id]
                state = self._state(req)
                if state.num_physical != req.num_computed_tokens:
                    raise BackendError(f"request {req.request_id}: engine says {req.num_computed_tokens} "
                                       f"tokens computed, the cache holds {state.num_physical}")
                rows.append((req, state, n, state.num_physical, req.num_computed_tokens + n >= req.num_tokens))
            return rows
        # Padded (static) batch: scheduled rows, then the batch's finished rows still holding their slot.
        members = [reqs[s.request_id] for s in batch.scheduled]
        members += list(engine.draining)[:len(shape) - len(members)]
        if len(members) != len(shape):
            raise BackendError(f"padded batch has {len(shape)} rows but {len(members)} requests hold slots")
        rows = []
        for req, (n, c) in zip(members, shape):
            state = self._state(req)
            if state.num_physical != c:
                raise BackendError(f"request {req.request_id}: padded row expects {c} cached tokens, "
                                   f"the cache holds {state.num_physical}")
            rows.append((req, state, n, c, True))  # every padded row samples (HF generate)
        return rows

    def _grow(self, req, state: SeqState, num_tokens: int) -> None:
        need = -(-num_tokens // self.block_size) - len(state.block_table)
        if need > len(self.free_blocks):
            raise BackendError(f"physical KV exhausted: request {req.request_id} needs {need} blocks, "
                               f"{len(self.free_blocks)} free")
        state.block_table.extend(self.free_blocks.pop() for _ in range(need))
        if len(state.block_table) > req.num_blocks:
            raise BackendError(f"request {req.request_id} holds {len(state.block_table)} physical blocks, "
                               f"the engine counts {req.num_blocks}")

    def _prepare(self, rows, engine, batch) -> StepInput:
        bs = self.block_size
        tokens, positions, slots, logit_rows = [], [], [], []
        groups: dict[tuple[int, int], tuple[list, list]] = {}
        row = 0
        for req, state, n, c, samples in rows:
            self._grow(req, state, c + n)
            table = np.asarray(state.block_table, dtype=np.int64)
            pos = np.arange(c + n)
            ctx_slots = table[pos // bs] * bs + pos % bs
            if batch.padded_shape is not None and c == 0:   # left-pad the prompt to the batch's length
                ids = [PAD_TOKEN] * (n - len(state.token_ids)) + state.token_ids
            elif batch.padded_shape is not None:            # a decode row (finished rows decode padding)
                ids = state.token_ids[-1:]
            else:
                ids = state.token_ids[c:c + n]
            tokens.append(np.asarray(ids, dtype=np.int64))
            positions.append(pos[c:])
            slots.append(ctx_slots[c:])
            q_rows, c_slots = groups.setdefault((n, c + n), ([], []))
            q_rows.append(np.arange(row, row + n))
            c_slots.append(ctx_slots)
            if samples:
                logit_rows.append(row + n - 1)
            row += n
        dev = self.device

        def put(a) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=True)

        seq_groups = [SeqGroup(n, ctx, put(np.stack(q)), put(np.stack(s))) for (n, ctx), (q, s) in groups.items()]
        return StepInput(put(np.concatenate(tokens)), put(np.concatenate(positions)),
                         put(np.concatenate(slots)), seq_groups, put(np.asarray(logit_rows, dtype=np.int64)))

    def _apply(self, rows, next_tokens: list[int]) -> None:
        it = iter(next_tokens)
        for req, state, n, c, samples in rows:
            state.num_physical = c + n
            if samples:
                token = next(it)
                if req.status is not Status.DRAINING and req.num_computed_tokens + n >= req.num_tokens:
                    state.token_ids.append(token)  # a real sample; padding rows' samples are dropped

    # ---- warm-up and logs ----
    def warm_up(self, max_tokens: int = 512, num_steps: int = 3) -> None:
        """Run a few throw-away steps of mixed sizes so that lazy initialisation (allocator pools, thread
        pools, CUDA kernels) happens before any timed step."""
        prompt = min(max_tokens, self.shape.max_model_len // 2)
        env = simpy.Environment()
        limits = EngineLimits(num_gpu_blocks=self.cache.num_blocks, block_size=self.block_size,
                              max_model_len=self.shape.max_model_len)
        engine = Engine(env, ChunkedPrefill(max_num_batched_tokens=max(prompt, 64)), ConstantCost(),
                        limits, executor=self)
        for i in range(4):
            engine.submit(RequestSpec(i, 0.0, prompt // (i + 1), num_steps + 1))
        env.run()
        self.reset()

    def records_frame(self):
        import pandas as pd
        return pd.DataFrame([asdict(r) for r in self.records])
