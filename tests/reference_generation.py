"""An independently written per-step generation loop: plain Hugging Face, heads zeroed before o_proj.

This is the authors' GSM8K protocol written the obvious way, sharing no code with
``inactive_heads``: the converted model folder is loaded with ``transformers`` alone; every layer's
attention runs through a small attention function registered here (causal softmax of
``q·kᵀ · scaling``, key/value heads repeated per query head) that keeps its weights ``A`` and
values ``V``; a forward pre-hook on ``o_proj`` computes the layer's scores from ``A`` and ``V`` in
float64 and zeroes the flagged heads of the ``o_proj`` input. No KV cache: at every new token the
whole sequence runs again and every head is re-decided (one sequence, no padding).

Scores (paper definitions, see the project's method notes):
- AHON (LN): ``o_t = Σ_s A[t,s] v_s``; AHON_h = mean_t ‖o_t‖; divided by its mean over the
  layer's heads; inactive if below τ.
- AWFT: mean over query rows t of ``A[t,0]``; inactive if above τ.
"""

import torch
from transformers import AttentionInterface, AutoModelForCausalLM

_NAME = "inactive_heads_reference"


def _reference_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    # query [1, H, T, d]; key/value [1, KV, T, d]; one unpadded sequence, no cache.
    n_heads, n_kv = query.shape[1], key.shape[1]
    key = key.repeat_interleave(n_heads // n_kv, dim=1)
    value = value.repeat_interleave(n_heads // n_kv, dim=1)
    T = query.shape[2]
    scores = (query @ key.transpose(-1, -2)) * scaling
    future = torch.ones(T, T, dtype=torch.bool, device=query.device).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")).float(), dim=-1).to(query.dtype)
    module._reference_A = weights[0]  # [H, T, T]
    module._reference_V = value[0]  # [H, T, d]
    return (weights @ value).transpose(1, 2).contiguous(), weights


AttentionInterface.register(_NAME, _reference_attention)


def head_scores(A: torch.Tensor, V: torch.Tensor, score: str) -> torch.Tensor:
    """One layer's scores [H] of one sequence, in float64, from weights A [H, T, T] and values V [H, T, d]."""
    A, V = A.double(), V.double()
    if score == "ahon_ln":
        o = A @ V  # [H, T, d]: o_t = sum_s A[t, s] v_s
        ahon = o.norm(dim=-1).mean(dim=1)
        return ahon / ahon.mean()
    if score == "awft":
        return A[:, :, 0].mean(dim=1)
    raise ValueError(score)


def inactive(values: torch.Tensor, score: str, tau: float) -> torch.Tensor:
    return values > tau if score == "awft" else values < tau


class ReferenceGenerator:
    def __init__(self, model_dir: str, tokenizer):
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=_NAME)
        self.model.eval()
        self.tokenizer = tokenizer
        self.layers = [layer.self_attn for layer in self.model.model.layers]
        self.n_heads = self.model.config.num_attention_heads
        self.rule = None  # (score, tau) or None
        self.flagged = 0
        self.passes = 0
        for attn in self.layers:
            attn.o_proj.register_forward_pre_hook(self._zero_before_o_proj(attn))

    def _zero_before_o_proj(self, attn):
        def hook(module, args):
            if self.rule is None:
                return None
            (x,) = args
            score, tau = self.rule
            flags = inactive(head_scores(attn._reference_A, attn._reference_V, score), score, tau)
            self.flagged += int(flags.sum())
            heads = x.view(x.shape[0], x.shape[1], self.n_heads, -1)
            return (heads.masked_fill(flags[None, None, :, None], 0.0).view_as(x),)

        return hook

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new: int, until: list[str], score=None, tau=None) -> list[int]:
        """Greedy tokens after ``prompt``; stops at EOS, ``max_new`` or a stop string."""
        self.rule = None if score is None else (score, tau)
        eos = self.tokenizer.eos_token_id
        out: list[int] = []
        while True:
            ids = torch.tensor([prompt + out])
            logits = self.model(input_ids=ids, use_cache=False).logits[0, -1]
            self.passes += 1
            out.append(int(logits.argmax()))
            text = self.tokenizer.decode(out, skip_special_tokens=False)
            if len(out) >= max_new or out[-1] == eos or any(s in text for s in until if s):
                return out

    def realized_fraction(self) -> float:
        return self.flagged / (self.passes * len(self.layers) * self.n_heads)
