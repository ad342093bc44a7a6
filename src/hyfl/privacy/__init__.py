"""Privacy layer: additively homomorphic ciphers, fixed-point encoding, private set intersection.

:mod:`hyfl.privacy.audit` is a test tool: it finds private values in disguise
(copied, scaled, negated, offset, in fixed point) in what a party observed.
"""
