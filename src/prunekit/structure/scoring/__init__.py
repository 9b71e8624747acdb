"""Group criteria: the importance of each unit of a channel group, over all its slices.

The score stage (trace -> groups -> score -> mask -> compensate -> compact -> save), read by
``prune_channels`` before it masks: ``criteria`` holds the protocol, the weight-only criteria
and the names they go by, ``calibrated`` the ones that learn from data (activations, Taylor),
``consequence`` the ones that rank a unit by the error its removal leaves (OBS, fluctuation),
``expert_criteria`` the ones for routed experts.
"""
