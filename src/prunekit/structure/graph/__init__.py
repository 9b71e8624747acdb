"""The channel dependency graph: one traced forward pass resolved into groups of coupled channels.

The first stage of structural pruning (trace -> groups -> score -> mask -> compensate ->
compact -> save), over ``structure.trace`` (the traced forward) and what it dispatches to
(``structure.handlers``, ``structure.families``). ``tables`` declares that dispatch: every op
name with its handler, and the module handlers in the order they are tried; ``custom`` lets a
user add to it (``register_op_handler``, ``register_module_handler``). ``grouping`` resolves
the trace into units, ``groups`` holds ``Slice`` and ``ChannelGroup``, and ``graph`` is the
entry point ``channel_groups`` with the argument checks the other entry points share.
"""
