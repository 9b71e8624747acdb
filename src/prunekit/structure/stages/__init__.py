"""``prune_channels`` as a frozen config and named stages, each a module with one job and
a typed object it hands to the next:

```text
ChannelConfig (channel_config: every option, checked once)
  -> trace    (trace_groups:      channel_groups, exclusions, kinds)   -> Traced
  -> score    (score_units:       the group criterion, prepared)       -> Scored
  -> allocate (allocate_units:    shares | experts | budget)           -> list[PrunedGroup]
                (shares, meet_budget over ledger)                         (BudgetReport)
  -> compensate (compensate_layers: before the masks: refuse, keep)    -> Compensation
  -> install  (install_masks:     masks, kept norms, router masks)
  -> Compensation.apply (the least-squares update, or the refit)
```

``prunekit.structure.stages.entry.run_stages`` runs them in one transaction; ``compact`` and
``export`` follow on the masked model.
"""

from prunekit.structure.stages.channel_config import DAMPING, ChannelConfig, ChannelOptions

__all__ = ["DAMPING", "ChannelConfig", "ChannelOptions"]
