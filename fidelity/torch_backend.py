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
import torch

from fidelity.torch_llama import Decoder, PagedKVCache, SeqGroup, StepInput, random_weights
from costmodels.catalog import ModelShape
from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.wiring import run_replica
from simcore.request import RequestSpec, Status

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAD_TOKEN = 0
PROBE_SEQS, PROBE_CTX = 4, 64  # the speed probe: one decode step of 4 sequences at context 64
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


class BackendError(RuntimeError):
    """The real backend and the engine's bookkeeping disagree (a bug in one of them): fail loudly."""


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
    normalised_s: float       # measured_s at the baseline speed: measured_s / speed_ratio, or (with
                              # speed_normalise) each repeat divided by the probes bracketing it


def batch_kind(prefill, decode) -> str:
    if prefill and decode:
        return "mixed"
    return "prefill_only" if prefill else "decode_only"


class RealBackend:
    """An engine executor (see `simcore.engine.Engine`): `execute(engine, batch, shape, cost_args)`
    runs the batch and returns seconds. One backend serves one engine run at a time; `reset()` between.

    `clock`: "wall" (default) times steps by the wall clock. "cpu" (CPU device, one torch thread only)
    times them by this thread's CPU time, i.e. what the step costs on a core of its own: on a shared
    machine, time the OS gives to other processes is then not counted as the engine's.

    `speed_normalise`: for a machine whose speed drifts within milliseconds (a shared VM: the identical
    probe step varies 15-20% over a second). The speed probe is timed right before and after the step's
    forward pass, which runs `step_repeats` times back to back (idempotent: the same K/V are written to the
    same slots, the same tokens come out); the step's normalised time is the median over repeats of
    forward time / mean of the two probes bracketing it x the baseline probe time, plus the scheduling and
    input preparation time divided by the same speed ratio. The engine then advances by that normalised
    time, so a real run's metrics are at the baseline speed; the first repeat's raw time is recorded too.
    """

    def __init__(self, shape: ModelShape, num_blocks: int, block_size: int, device: str = "cpu",
                 dtype: str = "fp32", seed: int = 0, reference_every_s: float = 2.0,
                 reference_base_s: float | None = None, clock: str = "wall", decode_attention: str | None = None,
                 speed_normalise: bool = False, step_repeats: int = 1):
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        if clock not in CLOCKS:
            raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
        if clock == "cpu" and (device != "cpu" or torch.get_num_threads() != 1):
            raise BackendError("clock cpu needs device cpu and torch.set_num_threads(1): the thread's CPU "
                               "time must cover all of the step's work")
        self.clock, self._now = clock, CLOCKS[clock]
        # "batched" (default): all decodes in one masked call per layer, as a paged-attention kernel runs
        # them (per-sequence calls would time Python dispatch, not the device); "per_seq": one call each
        self.decode_attention = decode_attention or "batched"
        if self.decode_attention not in ("per_seq", "batched"):
            raise ValueError(f"decode_attention: expected per_seq or batched, got {decode_attention!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError("device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
        if step_repeats < 1:
            raise ValueError(f"step_repeats: must be at least 1, got {step_repeats}")
        self.speed_normalise, self.step_repeats = speed_normalise, step_repeats if speed_normalise else 1
        self.shape, self.device, self.block_size, self.seed = shape, device, block_size, seed
        self.decoder = Decoder(random_weights(shape, device, DTYPES[dtype], seed))
        self.cache = PagedKVCache(shape, num_blocks, block_size, device, DTYPES[dtype])
        self.reference_every_s = reference_every_s
        self.probe_ctx = min(PROBE_CTX, shape.max_model_len)
        self._probe_cache = PagedKVCache(shape, PROBE_SEQS * -(-self.probe_ctx // block_size), block_size, device,
                                         DTYPES[dtype])
        self._probe_step = self._build_probe()
        self.reference_base_s = reference_base_s or self.reference_s()
        self.reset()

    def reset(self) -> None:
        """Forget all requests and logs (the KV memory itself is reused)."""
        self.seqs: dict[int, SeqState] = {}
        self.outputs: dict[int, list[int]] = {}  # request id -> prompt + generated token ids
        self.free_blocks = list(range(self.cache.num_blocks - 1, -1, -1))
        self.records: list[StepRecord] = []
        self.cost_args: list[dict] = []       # the engine's pricing arguments, per record
        self.speed_samples: list[tuple] = []  # (sim time, probe median, each probe repeat) in seconds
        self._last_reference_wall = -float("inf")
        self._last_step_end: float | None = None  # clock reading at the end of the previous step
        self._speed_ratio = 1.0

    # ---- the executor protocol ----
    def execute(self, engine, batch, shape, cost_args: dict) -> float:
        if getattr(engine, "prefix_cache", None) is not None:
            # shared physical blocks would need copy-on-write block tables; not modelled here
            raise BackendError("engine.enable_prefix_caching: the real backend does not share KV blocks")
        env = engine.env
        sched_s = self._time_since_clock(env) if self.clock == "wall" else self._cpu_since_last_step()
        self._maybe_time_reference(env)
        wall0 = time.monotonic()
        t0 = self._now()
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self._reconcile(engine)
        rows = self._rows(engine, batch, shape)
        step = self._prepare(rows, engine, batch)
        prep_s = self._now() - t0
        probes, forwards = [self._probe_once()] if self.speed_normalise else [], []
        for _ in range(self.step_repeats):
            t1 = self._now()
            next_tokens = self.decoder.forward(step, self.cache).tolist()  # .tolist() syncs the device
            forwards.append(self._now() - t1)
            if self.speed_normalise:
                probes.append(self._probe_once())
        t2 = self._now()
        self._apply(rows, next_tokens)
        forward_s = prep_s + forwards[0] + self._now() - t2
        self._last_step_end = self._now()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        measured_s = sched_s + forward_s
        if self.speed_normalise:
            bracket = (np.asarray(probes[:-1]) + np.asarray(probes[1:])) / 2
            ratio = float(np.median(bracket)) / self.reference_base_s
            normalised_s = ((measured_s - forwards[0]) / ratio
                            + float(np.median(np.asarray(forwards) / bracket)) * self.reference_base_s)
        else:
            ratio = self._speed_ratio
            normalised_s = measured_s / ratio
        if self.speed_normalise and self.clock == "wall" and hasattr(env, "real_start"):
            # the real-time clock must follow the normalised one: hide the repeats and probes (and the
            # difference between raw and normalised time) from it, as _maybe_time_reference hides its
            # probe; otherwise the next step's lateness (sched_s) would count them. (With clock "cpu"
            # sched_s is CPU time, and a real-time environment just runs behind the wall clock.)
            env.real_start += sched_s + time.monotonic() - wall0 - normalised_s
        prefill, decode = cost_args["prefill"], cost_args["decode"]
        self.records.append(StepRecord(
            env.now, batch_kind(prefill, decode), len(shape), len(prefill), sum(n for n, _ in prefill),
            len(decode), sum(decode), len(next_tokens), batch.padded_shape is not None,
            measured_s, sched_s, forward_s, faults, ratio, normalised_s))
        self.cost_args.append(cost_args)
        return normalised_s if self.speed_normalise else measured_s

    def _time_since_clock(self, env) -> float:
        """Wall time since the moment the simulated clock stands at (real-time environments only)."""
        if not hasattr(env, "real_start"):
            return 0.0
        return max(0.0, time.monotonic() - (env.real_start + (env.now - env.env_start) * env.factor))

    def _cpu_since_last_step(self) -> float:
        """CPU time this thread spent since the previous step ended (scheduling, bookkeeping)."""
        return 0.0 if self._last_step_end is None else max(0.0, self._now() - self._last_step_end)

    def _maybe_time_reference(self, env) -> None:
        now = time.monotonic()
        if now - self._last_reference_wall < self.reference_every_s:
            return
        ref_s = self.reference_s()
        self._speed_ratio = ref_s / self.reference_base_s
        self.speed_samples.append((env.now, ref_s, *self.last_probe_s))
        self._last_reference_wall = time.monotonic()
        if hasattr(env, "real_start"):  # the probe is not part of the workload: hide it from the clock
            env.real_start += self._last_reference_wall - now

    # ---- the speed index ----
    def _build_probe(self) -> StepInput:
        n, c = PROBE_SEQS, self.probe_ctx
        ctx = torch.arange(n * c, device=self.device).view(n, c)  # slots, one run per sequence
        ids = torch.arange(1, n + 1, device=self.device)
        return StepInput(ids, torch.full((n,), c - 1, device=self.device), ctx[:, -1],
                         [SeqGroup(1, c, torch.arange(n, device=self.device)[:, None], ctx)],
                         torch.arange(n, device=self.device))

    def _probe_once(self) -> float:
        """One timing of the probe step (no warm-up: it runs next to the step it brackets)."""
        _sync(self.device)
        t0 = self._now()
        self.decoder.forward(self._probe_step, self._probe_cache).tolist()
        return self._now() - t0

    def reference_s(self, reps: int = 3) -> float:
        """The machine's speed index: median time of a fixed decode step of this model (4 sequences at
        context 64, on a scratch cache), on this backend's clock. It exercises what steps spend their time
        on (operator dispatch, small GEMMs, attention), so ratios between two moments say how much
        faster or slower the machine is running this kind of work."""
        times = [self._probe_once() for _ in range(reps + 1)]  # the first is a warm-up
        self.last_probe_s = times[1:]  # the repeats themselves: their spread is the step-timing noise floor
        return float(np.median(times[1:]))

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
        groups: dict[tuple[int, int], tuple[list, list, np.ndarray | None]] = {}
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
            q_rows, c_slots, _ = groups.setdefault((n, c + n), ([], [], None))
            q_rows.append(np.arange(row, row + n))
            c_slots.append(ctx_slots)
            if samples:
                logit_rows.append(row + n - 1)
            row += n
        dev = self.device

        def put(a) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=True)

        if self.decode_attention == "batched":
            groups = self._merge_decodes(groups)
        seq_groups = [SeqGroup(n, ctx, put(np.stack(q)), put(np.stack(s)), None if m is None else put(m))
                      for (n, ctx), (q, s, m) in groups.items()]
        return StepInput(put(np.concatenate(tokens)), put(np.concatenate(positions)),
                         put(np.concatenate(slots)), seq_groups, put(np.asarray(logit_rows, dtype=np.int64)))

    @staticmethod
    def _merge_decodes(groups: dict) -> dict:
        """All decode groups as one masked call, padded to the longest context (padding reads slot 0, masked
        out). A lone decode goes through the same masked call, so every step with decodes pays one call."""
        decode_keys = [k for k in groups if k[0] == 1]
        if not decode_keys:
            return groups
        max_ctx = max(ctx for _, ctx in decode_keys)
        q_rows, c_slots, lengths = [], [], []
        for key in decode_keys:
            q, s, _ = groups.pop(key)
            q_rows += q
            c_slots += [np.pad(x, (0, max_ctx - len(x))) for x in s]
            lengths += [key[1]] * len(s)
        mask = np.arange(max_ctx)[None, :] < np.asarray(lengths)[:, None]
        groups[(1, max_ctx)] = (q_rows, c_slots, mask[:, None, None, :])
        return groups

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
        limits = EngineLimits(num_gpu_blocks=self.cache.num_blocks, block_size=self.block_size,
                              max_model_len=self.shape.max_model_len)
        specs = [RequestSpec(i, 0.0, prompt // (i + 1), num_steps + 1) for i in range(4)]
        run_replica(ChunkedPrefill(max_num_batched_tokens=max(prompt, 64)), ConstantCost(), limits, specs,
                    executor=self)
        self.reset()

    def records_frame(self):
        import pandas as pd
        return pd.DataFrame([asdict(r) for r in self.records])
