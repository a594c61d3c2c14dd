# Types for Cython's build of shm.py (pure-Python mode): a worker's Cache as an extension type, so each of a
# call's three cached reads takes its parts as C fields. shm.py stays the pure twin.

cdef class Cache:
    cdef public object segment, ttl_ns, worker, clock, _generation, _local_max, _shards, _counts, too_big
    cdef public dict _local   # a hit's lookup: a C call

    cpdef _remember(self, key, generation, stored_ns, value)
