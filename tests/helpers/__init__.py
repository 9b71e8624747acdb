"""Modules the tests share (imported as ``helpers.<name>``: pytest puts tests/ on ``sys.path``),
and the scripts some tests and benchmarks run in processes of their own."""
