"""load: benchmarks and load tests (Locust) for phasespec."""
