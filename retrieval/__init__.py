"""Plain-Python retrieval toolkit: documents, chunking, embeddings, the FAISS index, prompt
assembly, token budgets and context compression. Nothing here imports Ray."""
