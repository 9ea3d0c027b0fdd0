"""The executors of a sweep's passes (:class:`~inactive_heads.sweep.sequence.Executor`): here
(:mod:`.local`) or on Ray actors (:mod:`.ray`, which imports Ray only when it runs)."""
