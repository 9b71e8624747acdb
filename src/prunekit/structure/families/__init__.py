"""Model families read whole: attention heads per family and routed experts of MoE blocks.

Part of the trace stage (trace -> groups -> score -> mask -> compensate -> compact -> save),
with a hand in the later ones: ``attention`` holds one small adapter per attention family
(found by class name, in its one table ``ADAPTERS``) and updates the modules' head counts on
compaction, ``mha`` adapts torch's ``nn.MultiheadAttention``, ``heads`` holds what an adapter
reads (projections, head counts), ``experts`` makes routed experts units that are traced,
masked (the router's mask) and compacted. Their module handlers are listed in
``structure.graph.tables``; none registers itself on import.
"""
