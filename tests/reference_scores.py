"""A slow, obviously-correct reference for every score, written from the paper's formulas.

Each sequence is run alone (no padding) through ``run_with_cache``; every score is then computed
with explicit Python loops over layers, heads, query rows and keys. The streaming implementation in
``inactive_heads`` must match it number for number.
"""

import math

import torch


def reference_scores(model, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    n_kv = getattr(cfg, "n_key_value_heads", None) or H
    group = H // n_kv
    keys = [
        "awft", "awft_ln", "aeqd", "aeqd_ln", "ftvvn", "ftvvn_ln", "avvn", "avvn_ln",
        "lthon", "lthon_ln", "lthon_hn", "ahon", "ahon_ln", "fho", "fho_ln",
    ]
    out = {k: torch.zeros(len(sequences), L, H, dtype=torch.float64) for k in keys}
    names = [f"blocks.{l}.attn.hook_{n}" for l in range(L) for n in ("pattern", "v", "z")]
    for i, seq in enumerate(sequences):
        tokens = torch.tensor([seq])
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
        T = len(seq)
        for l in range(L):
            A = cache[f"blocks.{l}.attn.hook_pattern"][0].double()  # [head, q, k]
            V = cache[f"blocks.{l}.attn.hook_v"][0].double()  # [pos, kv_head, d_head]
            Z = cache[f"blocks.{l}.attn.hook_z"][0].double()  # [pos, head, d_head]
            W_O = model.blocks[l].attn.W_O.detach().double()  # [head, d_head, d_model]
            raw = {k: [0.0] * H for k in ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon", "fho")}
            for h in range(H):
                kv = h // group  # query head h reads KV head h // group (repeat_interleave)
                raw["awft"][h] = sum(A[h, t, 0].item() for t in range(T)) / T
                entropies = []
                for t in range(T):
                    e = 0.0
                    for s in range(t + 1):
                        a = A[h, t, s].item()
                        if a > 0:
                            e -= a * math.log(a)
                    entropies.append(e)
                raw["aeqd"][h] = sum(entropies) / T
                raw["ftvvn"][h] = V[0, kv].norm().item()
                raw["avvn"][h] = sum(V[t, kv].norm().item() for t in range(T)) / T
                raw["lthon"][h] = Z[T - 1, h].norm().item()
                raw["ahon"][h] = sum(Z[t, h].norm().item() for t in range(T)) / T
                raw["fho"][h] = sum((Z[t, h] @ W_O[h]).norm().item() for t in range(T)) / T
            for k, values in raw.items():
                mean = sum(values) / H
                for h in range(H):
                    out[k][i, l, h] = values[h]
                    out[f"{k}_ln"][i, l, h] = values[h] / mean if mean != 0 else 0.0
            mean_ahon = sum(raw["ahon"]) / H
            for h in range(H):
                out["lthon_ln"][i, l, h] = raw["lthon"][h] / mean_ahon
                out["lthon_hn"][i, l, h] = raw["lthon"][h] / raw["ahon"][h]
    return {k: v.float() for k, v in out.items()}
