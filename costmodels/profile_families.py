"""Measured-profile pricing of the model families beyond a dense Llama: MoE layers (router, top-k, grouped
expert GEMMs, timed as one kernel family over tokens, top-k and routing imbalance), MLA attention (latent
KV: decompressed prefill, absorbed decode; its own projections), fp8 GEMMs for fp8 weights, and a measured
TP all-reduce. Terms parallel the table-built model (costmodels/aic.py): `moe`, `mla_*`, `allreduce`.

Ignored: expert parallelism (the capture times TP-sharded experts on one GPU; EP is refused), fp8 expert
GEMMs (the MoE family is timed in the profile's dtype), the shared experts' SiLU (inside the GEMM noise),
and rotary over MLA's rope dims only (the measured rotary covers the full heads: an upper bound).
"""
from __future__ import annotations

from costmodels.catalog import CatalogError, ModelShape
from costmodels.profile import ELEMENTWISE_PER_LAYER, LogGrid, ProfileCostModel

FP8_FORMATS = ("fp8", "fp8_block")


def moe_gemm_shapes(model: ModelShape, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(N, K) of a MoE layer's shared-expert GEMMs on one of `tp` GPUs (the routed experts are the `moe`
    family); empty for a dense model or one without shared experts."""
    s, h = model.shared_expert_intermediate_size, model.hidden_size
    if not model.is_moe or not s:
        return {}
    return {"shared_gate_up": (2 * s // tp, h), "shared_down": (h, s // tp)}


def mla_gemm_shapes(model: ModelShape, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(N, K) of MLA's projections outside attention on one of `tp` GPUs, as vLLM runs them: Q (through
    q_lora_rank when the model has one), the KV down-projection to latent + rope key (replicated over TP),
    and O. The KV up-projection (kv_b) runs inside the attention families (decompressed or absorbed)."""
    if not model.is_mla:
        return {}
    h, heads = model.hidden_size, model.num_heads // tp
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    q = ({"mla_q_a": (model.q_lora_rank, h), "mla_q_b": (heads * qk, model.q_lora_rank)} if model.q_lora_rank
         else {"mla_q": (heads * qk, h)})
    return {**q, "mla_kv_a": (model.kv_lora_rank + model.qk_rope_head_dim, h), "mla_o": (h, heads * model.v_head_dim)}


def extra_gemm_shapes(model: ModelShape, tp: int = 1) -> dict[str, tuple[int, int]]:
    return {**mla_gemm_shapes(model, tp), **moe_gemm_shapes(model, tp)}


def moe_shape(model: ModelShape, tp: int = 1) -> dict:
    """What the `moe` family was timed for: the routed experts of one GPU (every expert, 1/tp of its width)."""
    return {"hidden_size": model.hidden_size, "expert_width": model.moe_intermediate_size // tp,
            "num_experts": model.num_experts}


def mla_shape(model: ModelShape, tp: int = 1) -> dict:
    return {"num_heads": model.num_heads // tp, "kv_lora_rank": model.kv_lora_rank,
            "qk_rope_head_dim": model.qk_rope_head_dim, "qk_nope_head_dim": model.qk_nope_head_dim,
            "v_head_dim": model.v_head_dim}


def needs_family_pricing(profile: dict, model: ModelShape, deployment) -> bool:
    """Whether `FamilyProfileCostModel` must price this model (else the dense ProfileCostModel does)."""
    fp8 = deployment is not None and deployment.weight_format(model) in FP8_FORMATS
    return model.is_moe or model.is_mla or fp8 or "allreduce" in profile["families"]


class FamilyProfileCostModel(ProfileCostModel):
    """ProfileCostModel whose per-layer term prices MoE layers with the `moe` family (at the model's top-k
    and the deployment's `expert_load_imbalance`), MLA projections with their own GEMM curves (attention
    itself: the profile's prefill_attn / decode_attn, which for an MLA model are the MLA families), fp8
    weights with the fp8 GEMM curves, and TP all-reduces with the measured family when the profile has it."""

    def __init__(self, profile: dict, model: ModelShape, gpu, tp: int = 1, dtype: str = "bf16",
                 source: str = "<dict>", deployment=None):
        super().__init__(profile, model, gpu, tp, dtype, source)
        fam, shapes = profile["families"], profile.get("shapes", {})
        self.expert_load_imbalance = deployment.expert_load_imbalance if deployment is not None else 1.0
        if deployment is not None and deployment.ep > 1:
            raise CatalogError(f"{source}: enable_expert_parallel: a calibrated profile times TP-sharded "
                               "experts on one GPU; expert parallelism is not calibrated (use profile: aic)")
        if deployment is not None and model.is_moe and deployment.data_parallel_size > 1:
            raise CatalogError(f"{source}: data_parallel_size {deployment.data_parallel_size}: vLLM shards each "
                               "expert over the TP x DP ranks and runs it over every rank's tokens; a calibrated "
                               "profile times one TP layout's experts (use profile: aic)")
        fp8 = deployment is not None and deployment.weight_format(model) in FP8_FORMATS
        if fp8 and "gemm_fp8_down" not in fam:
            raise CatalogError(f"{source}: fp8 weights, but the profile has no fp8 GEMM timings (calibrate on "
                               "a GPU with fp8 tensor cores, sm89+)")
        prefix = "gemm_fp8_" if fp8 else "gemm_"
        self.layer_gemm = {name[len(prefix):]: LogGrid.from_dict(g) for name, g in fam.items()
                           if name.startswith(prefix) and not (prefix == "gemm_" and name.startswith("gemm_fp8_"))}
        self.weights = "fp8" if fp8 else dtype
        self.attn_ops = tuple(mla_gemm_shapes(model, tp)) if model.is_mla else ("qkv", "o")
        self.shared_ops = tuple(moe_gemm_shapes(model, tp))
        missing = [op for op in (*self.attn_ops, *self.shared_ops) if op not in self.layer_gemm]
        if missing:
            raise CatalogError(f"{source}: profile lacks GEMM timings for {model.name}'s {', '.join(missing)} "
                               "(fitted before MoE/MLA calibration, or for another model): recalibrate")
        self.moe = None
        if model.num_moe_layers:
            if "moe" not in fam:
                raise CatalogError(f"{source}: {model.name} is a MoE model, but the profile has no `moe` family "
                                   "(fitted before MoE calibration, or for a dense model): recalibrate")
            want, have = moe_shape(model, tp), shapes.get("moe")
            if have != want:
                raise CatalogError(f"{source}: profile's experts {have} are not {model.name}'s {want}")
            self.moe = LogGrid.from_dict(fam["moe"])
        if model.is_mla and shapes.get("mla") != mla_shape(model, tp):
            raise CatalogError(f"{source}: profile's MLA attention {shapes.get('mla')} is not "
                               f"{model.name}'s {mla_shape(model, tp)}")
        self.allreduce = LogGrid.from_dict(fam["allreduce"]) if "allreduce" in fam and tp > 1 else None

    def describe(self) -> dict:
        d = super().describe()
        d.update(weights=self.weights, expert_load_imbalance=self.expert_load_imbalance,
                 allreduce="measured" if self.allreduce is not None else "roofline prior")
        return d

    def moe_layer_s(self, num_tokens: int) -> float:
        """Router, top-k, routed experts (one grouped GEMM each way) and shared experts of one MoE layer."""
        m = self.model
        t = self.moe(float(num_tokens), float(m.experts_per_token), self.expert_load_imbalance)
        return t + sum(self.layer_gemm[op](num_tokens) for op in self.shared_ops)

    def _dense_layer_s(self, num_tokens: int) -> float:
        """The mean layer: attention projections, elementwise work and all-reduces of every layer; the
        dense MLP (with its SiLU) on the dense layers' share, the MoE layer on the MoE layers' share."""
        m, g = self.model, self.layer_gemm
        t = sum(g[op](num_tokens) for op in self.attn_ops)
        t += sum(n * self.elementwise[op](num_tokens) for op, n in ELEMENTWISE_PER_LAYER.items() if op != "silu_mul")
        moe_share = m.num_moe_layers / m.num_layers if self.moe is not None else 0.0
        if moe_share < 1.0:
            dense = g["gate_up"](num_tokens) + g["down"](num_tokens) + self.elementwise["silu_mul"](num_tokens)
            t += (1.0 - moe_share) * dense
        if moe_share:
            t += moe_share * self.moe_layer_s(num_tokens)
        return t + self._allreduce_s(num_tokens) + self.overheads.per_layer_s

    def _allreduce_s(self, num_tokens: int) -> float:
        """Two all-reduces per layer: the measured family at this TP degree, else the prior's terms."""
        if self.allreduce is None:
            return super()._allreduce_s(num_tokens)
        return 2 * self.allreduce(float(num_tokens))
