"""The end-to-end tier: whole pools and what an operator runs.

Agents as separate ``twistd`` processes, network namespaces cut with ``ip``, the
sandbox, headless Chromium and Prometheus. Each scenario is a smoke test of the wiring
whose logic the unit tier proves on a Clock (docs/testing.md).
"""
