"""Collections under change: how soon an added document is answered from, whether a deleted
one ever comes back, and what continuous ingestion does to the queries (issue 11's goals).

    python -m bench.ingestion [--adds 20] [--delete-queries 1000] [--phase-s 150] \\
        [--phases 4] [--rate R] [--docs-per-job 20] [--seed 0] [--out bench-results/ingestion]

One `serve run` of serve_config.yaml as shipped (CPU: SmolLM2-135M in vLLM inside Ray, one
replica per stage, the real generator: its CPU use competes with the writer's as it would in
production), with only the HTTP port and `collections.root` (a temporary folder, never
indexes/) changed. A collection is created and filled with the 36 documents of data/corpus
(retrieval.documents.load_documents, sent as JSON records). Answers are kept short
(`--max-tokens`, default 2): the figures are about retrieval and the pipeline under
ingestion, not about generating answers. Every query is a non-streaming POST /v1/rag/query
naming the collection, timed on the client (E2E); the service's default top_k (5).

0. Calibration: a few warm-up queries, `--calibrate-queries` one at a time (single-query
   E2E), then `--capacity-queries` closed loop at concurrency 4 (what one generator replica
   sustains, roughly). The load's rate is `--rate-fraction` (0.45) of that throughput,
   unless `--rate` is given.
1. Add, then query (goal: answered from within one publish cycle). `--adds` documents, each
   one invented fact in seeded random words (a place with a made-up name, a count, a
   keeper), added one at a time. t0: the moment the 202 returns. Queries about the fact go
   one after another until one cites the document; the time from t0 to that answer's
   return, and the job's own duration (finished_at - created_at), are recorded. The goal is
   met when every query *sent after its job had finished* cited the document: then the first
   answer after publication always has it. Median, p95, max with a bootstrap 95% CI of the
   median (n = adds).
2. Delete (goal: 0 of 1,000 later queries retrieve it). A fact shown to be retrieved (one
   query, then `--delete-precheck` paraphrases, whose hit rate shows that the check can see
   the document at all) is deleted; once its job has succeeded, `--delete-queries`
   paraphrases (drawn with a fixed seed) run at concurrency `--delete-concurrency`, and any
   answer whose sources hold the document counts against the goal, as does any non-200.
3. Steady load with and without ingestion (goal: 0 failed or hung queries, p99 within 1.5x
   of no ingestion). Open-loop Poisson arrivals (seeded) at the fixed rate, questions of
   `--load-questions`, over `--phases` phases in ABBA order: quiet / ingesting / ingesting /
   quiet / ... (a drift linear in time falls equally on both conditions; run 2 showed the
   quiet phases themselves drifting). In an ingesting phase, jobs run back to back, each
   adding `--docs-per-job` new documents of real text (SQuAD dev paragraphs when
   bench.squad's cache holds them, else data/corpus split into paragraphs; nothing is
   downloaded); a phase ends after `--phase-s` seconds, an ingesting one once the job then
   running has finished, so no job spills into a quiet phase. The same load runs for
   `--warm-up-s` first, not counted: after part 2's different questions, vLLM's prefix cache
   holds none of the load's prompts, and the first quiet phase would pay for refilling it.
   A query belongs to the phase it was sent in; one with no answer within `--hung-s` is
   hung. Per condition: n, p50, p99 E2E of the 200s, non-200s, hung, documents/s; p99 and
   p50 ingesting / quiet with `ratio_ci` (independent samples, 95%). A ratio whose interval
   holds 1 is no detectable difference.

Writes OUT/<label>.json (config, summary, every request and job) and OUT/<label>.md; the
service's log is OUT/<label>.serve.log.
"""
