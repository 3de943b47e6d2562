"""The questions the labs ask of the default collection (data/corpus/)."""

from __future__ import annotations

# Each is answered by a document in data/corpus/ (file name in the comment).
DEFAULT_QUESTIONS: tuple[str, ...] = (
    "What is the difference between TTFT and TPOT?",  # ttft-and-tpot
    "How should TTFT and TPOT be measured separately on the client?",  # measuring-ttft-and-tpot
    "What does inter-token latency measure?",  # inter-token-latency
    "What makes up the end-to-end latency of an LLM request?",  # end-to-end-latency
    "What is goodput and how does it differ from throughput?",  # goodput-and-slos
    "Why is only a full KV block cached by the prefix cache?",  # prefix-caching
    "How should a prompt be laid out to get prefix cache hits?",  # prompt-layout-for-prefix-...
    "What is the KV cache and why does it exist?",  # kv-cache-basics
    "How do you calculate the KV cache size per token?",  # kv-cache-size-per-token
    "How does PagedAttention store the KV cache in blocks?",  # pagedattention-and-kv-blocks
    "What is continuous batching and why does it beat static batching?",  # static-vs-continuous
    "What is chunked prefill?",  # chunked-prefill
    "Why is decode memory-bandwidth bound while prefill is compute bound?",  # prefill-and-decode
    "When does speculative decoding hurt at high load?",  # speculative-decoding-under-load
    "How does LLMLingua compress a prompt?",  # prompt-compression-llmlingua
    "What are the trade-offs of prompt compression?",  # prompt-compression-tradeoffs
    "How do AWQ and GPTQ quantize weights to 4 bits?",  # awq-and-gptq
    "When should you pick an HNSW or IVF FAISS index over a flat one?",  # faiss-index-types
    "How does Ray Serve autoscale replicas?",  # ray-serve-replicas-and-autoscaling
    "What should a service do when its queue is full?",  # backpressure-and-queueing
)
