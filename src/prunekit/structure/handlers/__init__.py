"""Handlers the tracer dispatches to: how each tensor op and each layer maps channel labels.

Part of the trace stage (trace -> groups -> score -> mask -> compensate -> compact -> save):
``ops`` for the tensor ops (element-wise, broadcasting, moves, pools, reductions), ``layers``
for the modules (convolutions, linear, norms, PReLU, embeddings), ``norms`` for norms over a
pruned hidden width (RMSNorm traced whole, and the masked norms kept after pruning). None
registers itself: the table ``structure.graph.tables.HANDLERS`` names each handler and the ops
it takes.
"""
