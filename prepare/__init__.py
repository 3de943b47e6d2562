"""The compressor stage without Ray: from a retrieval to the chat messages the generator
receives. Sanitising, the registry of compression methods, their cost model, token budgets,
prompt assembly, and attributing an answer's sentences to their sources.

Builds on `retrieval/` (the index's sentences); imports no Ray, no web framework, no app.
"""
