"""The FAISS index of the next version of an index folder (corpus.incremental), made by
updating the previous version's index where its kind allows, so the kept chunks' vectors are
neither embedded nor, where avoidable, indexed again.

The next index holds the kept rows of the previous index, in their previous order, then the
new vectors: a chunk's position in the chunk list is its faiss id. The previous index is
never changed (the previous folder is only read, and may be serving): each update works on a
copy, which starts from faiss's own search breadth as a fresh build does (the caller then sets
the breadth asked for).

What is incremental per kind, when the previous index has the kind and build settings
(BUILD_SETTINGS) resolved now:
- `flat`: copied, the removed rows deleted and the new vectors appended. IndexFlat's
  remove_ids compacts its storage and keeps the order, so the ids stay the positions.
- `hnsw`: copied and appended to when nothing is removed: adding is how an HNSW graph is
  built anyway. With rows removed it is rebuilt from the kept and new vectors, because HNSW
  cannot delete (faiss has no remove_ids for it).
- `ivf`: keeps its trained quantizer (training, k-means, is the costly part) and is reset and
  refilled with the kept and new vectors, without retraining. It is refilled, not deleted
  from, because IVF's remove_ids keeps the ids of the rows left, which would no longer be the
  positions. The centroids stay those of the collection it was trained on: rebuild with
  retrieval.build once the collection has drifted far from it. It is retrained (a new index)
  when the collection has outgrown its number of lists (retrieval.index.ivf_lists: a first
  version of a few chunks trains one list).
- Another kind (an `auto` tier change) or other build settings: a new index from the vectors.

The kept vectors are read back from the previous index (reconstruct_n; IVF first needs its
direct map), not embedded again.
"""

from __future__ import annotations

import numpy as np

from retrieval.index import FaissIndex, IndexParams, ivf_lists, new_faiss_index

# The settings a built index of each kind is made with; it is updated only where they match.
BUILD_SETTINGS = {"flat": (), "hnsw": ("hnsw_m", "hnsw_ef_construction"), "ivf": ("ivf_nlist",)}
# faiss's own search breadths (IndexParams: None keeps them), for a copied index to start from.
FAISS_DEFAULT_NPROBE = 1
FAISS_DEFAULT_EF_SEARCH = 16


def next_faiss_index(
    before: FaissIndex | None, kept_rows: list[int], new_vectors: np.ndarray, params: IndexParams
):
    """The FAISS index of the kept rows of `before` then `new_vectors`, in that order:
    `before`'s index updated where its kind allows (module docstring), else a new one."""
    import faiss

    if not kept_rows and not len(new_vectors):
        return faiss.IndexFlatIP(new_vectors.shape[1])
    if before is not None and _same_build(before.manifest.index, params):
        old = before.faiss_index
        removed = np.setdiff1d(np.arange(old.ntotal, dtype=np.int64), kept_rows)
        if params.kind == "flat" or (params.kind == "hnsw" and not removed.size):
            index = _copy(old)
            if removed.size:
                index.remove_ids(faiss.IDSelectorBatch(removed))
            index.add(new_vectors)
            return index
        # A quantizer trained on a smaller collection may have fewer lists than it now needs.
        if params.kind == "ivf" and old.nlist >= ivf_lists(
            params, len(kept_rows) + len(new_vectors)
        ):
            index = _copy(old)
            index.reset()  # empties the lists, keeps the trained quantizer
            index.add(np.concatenate([_kept_vectors(old, kept_rows), new_vectors]))
            return index
    kept = _kept_vectors(before.faiss_index, kept_rows) if before else new_vectors[:0]
    vectors = np.concatenate([kept, new_vectors])
    index = new_faiss_index(vectors, params)
    index.add(vectors)
    return index


def _same_build(previous: dict, params: IndexParams) -> bool:
    if previous.get("kind") != params.kind:
        return False
    return all(previous.get(name) == getattr(params, name) for name in BUILD_SETTINGS[params.kind])


def _copy(faiss_index):
    """A copy to update; it starts from faiss's search breadth, as a fresh build does."""
    import faiss

    index = faiss.clone_index(faiss_index)
    if hasattr(index, "nprobe"):
        index.nprobe = FAISS_DEFAULT_NPROBE
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = FAISS_DEFAULT_EF_SEARCH
    return index


def _kept_vectors(faiss_index, kept_rows: list[int]) -> np.ndarray:
    """The stored vectors of `kept_rows`, read back from the index, not embedded again."""
    if hasattr(faiss_index, "make_direct_map"):
        faiss_index.make_direct_map()  # IVF finds a vector by id only through this map
    return faiss_index.reconstruct_n(0, faiss_index.ntotal)[kept_rows]
