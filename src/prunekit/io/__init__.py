"""Files: reading and writing state_dicts, checkpoints of pruned models, offline pruning
of a state_dict without the model's code."""
