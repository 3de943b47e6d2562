"""Starting, probing and stopping the real service, for the tests and the benchmarks alike.

- `service`: `serve run` of a config in a Ray instance of its own, awaited and stopped by
  its process group; `vllm_server`: vLLM's own OpenAI server for the same generator.
- `variant`: a serve config with dotted-key overrides, validated before it is written.
- `processes`: the processes a started service owns (replicas, engines), for fault tests.
- `cluster`: a real multi-node Ray cluster on this machine (one `ray start` per node), for
  the node-loss scenario of bench.chaos.
"""
