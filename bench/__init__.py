"""The lab: experiments and evaluations that drive the running service over HTTP.

Shared pieces: `client` (the one blocking HTTP client), `loadgen` (streaming load),
`stats` (every figure's statistics and 95% intervals; TPOT is the product's),
`tables` (the one Markdown renderer), `labs` (argument types, starting service
variants, writing a run). Live labs: `suite` (latency and quality plans), `quality` and
`quality_report`, `reuse`, `context_sweep`, `chaos`, `upload_flood`, `refusal`,
`parse_cost`, and on a GPU `gpu_smoke`. Answered experiments are retired: docs/retired.md
names the commits that run them. The bottleneck advisor is a tool of its own (`advisor/`);
nothing outside bench imports bench.
"""
