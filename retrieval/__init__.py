"""The search stage without Ray: documents, chunking, embeddings, the FAISS index, BM25,
rank fusion, the retriever, and the index build (`python -m retrieval.build`).

Imports nothing above it: `prepare/` and `corpus/` build on it, never the other way round.
"""
