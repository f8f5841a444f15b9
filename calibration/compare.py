"""Compare two cost models with each other, kernel by kernel and step by step.

    python -m calibration.compare PROFILE_A PROFILE_B [--model llama-3-8b --gpu h200-sxm]

Each argument a profile path, a shipped profile name, or "roofline"; prints B / A at
representative shapes (ratio above 1: B predicts slower).
"""
from __future__ import annotations

import json
import sys

from commandline.exits import refuse, run_main
from commandline.parser import Parser
from costmodels.catalog import CatalogError, get_gpu, get_model
from costmodels.profile import GEMM_OPS, ProfileCostModel, read_profile
from costmodels.selection import PROFILES_DIR, load_cost_model

KERNELS = [(f"gemm_{op} m={m}", "gemm", op, m) for op in (*GEMM_OPS, "lm_head") for m in (1, 64, 512, 4096, 16384)]
ATTENTION = [("prefill_attn 1x512", "prefill_attn", 1, 512), ("prefill_attn 1x4096", "prefill_attn", 1, 4096),
             ("prefill_attn 8x1024", "prefill_attn", 8, 1024), ("decode_attn 1x1024", "decode_attn", 1, 1024),
             ("decode_attn 64x2048", "decode_attn", 64, 2048), ("decode_attn 256x4096", "decode_attn", 256, 4096)]
STEPS = [("decode 1 x ctx 512", [], [512]), ("decode 64 x ctx 2048", [], [2048] * 64),
         ("decode 256 x ctx 1024", [], [1024] * 256), ("prefill 512", [(512, 0)], []),
         ("prefill 4096", [(4096, 0)], []), ("chunk 512 + 32 decodes", [(512, 1024)], [1500] * 32)]


def kernel_s(cost, family: str, a, b) -> float | None:
    """A single kernel's time from a profile (None for the roofline prior, which has no kernel table)."""
    if not isinstance(cost, ProfileCostModel):
        return None
    if family == "gemm":
        return cost.gemm[a](b)
    if family == "prefill_attn":   # a sequences of b tokens each
        return cost.prefill_layer_s([(int(b), 0)] * int(a))
    return cost.decode_attn(a, b)


def compare(a, b) -> list[tuple[str, float | None, float | None]]:
    rows = [(name, kernel_s(a, fam, x, y), kernel_s(b, fam, x, y)) for name, fam, x, y in KERNELS + ATTENTION]
    rows += [(f"step: {name}", a.step_time_s(p, d), b.step_time_s(p, d)) for name, p, d in STEPS]
    return rows


def _describe_target(arg: str) -> dict:
    if arg == "roofline":
        return {}
    path = PROFILES_DIR / f"{arg}.json" if (PROFILES_DIR / f"{arg}.json").exists() else arg
    return read_profile(path)


def _looks_like_run(target: str) -> bool:
    from pathlib import Path
    p = Path(target)
    return p.is_dir() or p.suffix.lower() == ".csv" or (p.suffix.lower() == ".json" and _not_profile(p))


def _not_profile(p) -> bool:
    try:
        return json.loads(p.read_text()).get("format") not in ("batchsim-profile/1", "batchsim-stepfit/1")
    except (OSError, ValueError, AttributeError):
        return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    runs_options = {"--config", "--profile", "--out"}   # fidelity.compare's options: real runs were meant
    if any(a.split("=")[0] in runs_options for a in argv) or (first is not None and _looks_like_run(first)):
        from calibration.moved import forward   # real runs: fidelity's command now
        forward("calibration.compare RUN ...", "fidelity.compare", argv)
    ap = Parser(prog="python -m calibration.compare", description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--model", help="default: the profiles' model")
    ap.add_argument("--gpu", help="default: the profiles' GPU")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        found = [_describe_target(x) for x in (args.a, args.b)]
        ref = next((p for p in found if p), None)
        if ref is None and not (args.model and args.gpu):
            ap.error("comparing roofline with roofline needs --model and --gpu")
        model = get_model(args.model or ref["model"])
        gpu = get_gpu(args.gpu or ref["gpu"]) if (args.gpu or ref["gpu"] in _gpus()) else None
        tp, dtype = (ref["tp"], ref["dtype"]) if ref else (1, "bf16")
        costs = [load_cost_model(x, model, gpu or get_gpu("h100-sxm"), tp, dtype) for x in (args.a, args.b)]
    except CatalogError as e:
        return refuse(e)
    rows = compare(*costs)
    if args.json:
        print(json.dumps([{"shape": n, "a_s": x, "b_s": y} for n, x, y in rows], indent=1))
        return 0
    print(f"A = {args.a}\nB = {args.b}\n{'shape':34s} {'A ms':>10s} {'B ms':>10s} {'B/A':>6s}")
    for name, x, y in rows:
        if x is None or y is None:
            continue
        print(f"{name:34s} {x * 1e3:10.4f} {y * 1e3:10.4f} {y / x:6.2f}")
    return 0


def _gpus():
    from costmodels.catalog import GPUS
    return GPUS


if __name__ == "__main__":
    run_main(main, (CatalogError,))
