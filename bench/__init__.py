"""Benchmark suite for memory_node: engine-level query latency and exactness, save ->
searchable, ingest, footprint and start-up, the ROS round trip, and peer stores on the same
workload. Run with `python -m bench` (see `python -m bench --help`); results land in
bench/results/ and BENCHMARKS.md."""
