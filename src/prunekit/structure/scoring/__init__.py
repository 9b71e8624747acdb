"""Group criteria: the importance of each unit of a channel group, over all its slices.

The score stage of ``prune_channels`` (``prunekit.structure.stages.score_units``) reads them
before it masks: ``protocol`` holds what a criterion is (``GroupCriterion``, its one
``prepare``, the ``Calibration`` it gathers from) and the sums over a unit's entries,
``weights`` the criteria of the weights alone ('l1', 'l2', 'bn_scale'), ``calibrated`` the
ones that learn from data (activations, Taylor), ``consequence`` the ones that rank a unit by
the error its removal leaves (OBS, fluctuation), ``expert_criteria`` the ones for routed
experts, and ``criteria`` the one table of them by name (``TABLE``) with the checks and the
scoring every caller goes through.
"""
