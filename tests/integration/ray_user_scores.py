"""A score registered in user code, for the Ray test of ``SweepConfig.imports``: the workers know
it only if they import this module."""

import inactive_heads as ih


@ih.register_score("user_max_key_weight", reads=("pattern",), direction="above")
def user_max_key_weight(acts):
    """Largest attention weight of each query, averaged over the real queries."""
    return acts.mean_over_queries(acts.pattern.amax(dim=-1))
