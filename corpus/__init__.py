"""Document collections without Ray: the versioned store on disk, uploads, ingestion jobs,
incremental index versions, and the catalog that says which loaded index serves a
collection. The collections API (`app/collections_api.py`) and the collection writer
(`deployments/collection_writer.py`) are its callers.

Named corpus, not collections, so it never shadows the standard library's module.
"""
