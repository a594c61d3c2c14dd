# Types for Cython's build of auth.py (pure-Python mode): the per-call Caller and the Authenticator as extension
# types, so a caller is made without an instance dict and the authenticator reads its parts as C fields. auth.py
# stays the pure twin.

cdef class Caller:
    cdef public object name, admin, via, grants, key, claims, role, claim_binding


cdef class Authenticator:
    cdef public object store, _admin, _admin_caller, tokens, _role_claim, _fixed_role, _user_claim
    cdef public dict _touched   # _touch's lookup: a C call
    cdef public object _role_grants, challenges, _reserved_said
    cdef public dict _reserved

    cpdef auth_required(self)
    cpdef _touch(self, name, previous)
