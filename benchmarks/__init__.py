"""Benchmark scripts (benchmarks/README.md); run them from the repository root as modules,
`python -m benchmarks.<script>`, so that they import each other and `tests` as packages."""
