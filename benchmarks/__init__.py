"""Benchmark and analysis tools: speed/memory, approximation error, cost, spectrum, reports.

Each tool is a program with `main(argv=None)`:

    python -m benchmarks.speed --out=benchmark_results/speed
    python -m benchmarks.approx_error --out=benchmark_results/approx_error --source=runs/digits
    python -m benchmarks.cost --out=benchmark_results/cost
    python -m benchmarks.spectrum --source=runs/digits --out=benchmark_results/spectrum
    python -m benchmarks.report runs/* --out=benchmark_results/report

and writes `<out>/<name>.json`, `<out>/<name>.md` and `<out>/*.png`. Shared
pieces live in `common` (command lines), `attention_bench` (building attention from a
name), `timing` (timed calls, exponent fits), `machine` (memory and device facts),
`xla_stats` (compiled memory and FLOPs), `output` (JSON, markdown, plots) and `runs`
(workdirs and captured q, k, v).
See docs/benchmarks.md for what each measures and example results.
"""
