"""The request path as plain asyncio: the messages stages exchange, the `Stages` protocol,
and the RAG pipeline that drives them. No web framework and no Ray."""
