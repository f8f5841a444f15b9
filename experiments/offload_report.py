"""How KV offload results read in the console table and summary.md (the results.csv columns stay as the
run wrote them: offload_hit_rate, offload_bytes_loaded, offload_bytes_stored, offload_hit_tokens)."""
from __future__ import annotations

import pandas as pd

# readable column -> (results column, scale)
OFFLOAD_COLUMNS = {"offload_hit_pct": ("offload_hit_rate", 100.0),
                   "offload_loaded_gb": ("offload_bytes_loaded", 1e-9),
                   "offload_stored_gb": ("offload_bytes_stored", 1e-9),
                   "loaded_prompt_ktok": ("offload_hit_tokens", 1e-3),
                   "recomputed_prompt_ktok": ("num_recomputed_prompt_tokens", 1e-3)}


def with_offload_columns(results: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`results` with the readable offload columns added, and their names; unchanged (no names) when no
    row ran with engine.kv_offload."""
    if "offload_hit_rate" not in results.columns or results["offload_hit_rate"].isna().all():
        return results, []
    out = results.copy()
    for name, (col, scale) in OFFLOAD_COLUMNS.items():
        out[name] = out[col] * scale
    return out, list(OFFLOAD_COLUMNS)
