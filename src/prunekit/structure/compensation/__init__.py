"""Compensation: what the kept weights and statistics become once units of groups are removed.

The compensate stage (trace -> groups -> score -> mask -> compensate -> compact -> save), run
by ``prune_channels`` after it masks, or by the user afterwards: ``compensate`` is the
consumers' least-squares update, ``refit`` the update towards the unpruned model's outputs,
``recalibrate`` (``recalibrate_norms``) BatchNorm running statistics re-estimated on data.
"""
