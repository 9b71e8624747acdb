"""The channel dependency graph: one traced forward pass resolved into groups of coupled channels.

The first stage of structural pruning (trace -> groups -> score -> mask -> compensate ->
compact -> save). ``trace`` labels every value with the channels it carries (``labels`` holds
the helpers on label tensors; ``skim`` lets the traced forward skip the arithmetic the graph
never reads), ``grouping`` resolves the trace into units, ``groups`` holds
``Slice`` and ``ChannelGroup``, and ``graph`` is the entry point ``channel_groups`` with the
argument checks the other entry points share. The handlers the tracer dispatches to live in
``structure.handlers`` and ``structure.families``; ``graph`` imports them so they register.
"""
