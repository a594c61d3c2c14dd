# Types for Cython's build of metadata.py (pure-Python mode): the cached reads' base as an extension type, so the
# three reads of a call take the store's state as C fields (MetadataStore, a Python subclass for its __getattr__
# and the write methods set on it, stays a plain class). metadata.py stays the pure twin.

cdef class _Reads:
    cdef public object inner, _cache, _make_cache, _tx, _open_transactions, _threads_started

    cdef _cached(self, key, read, args, convert, cacheable)
