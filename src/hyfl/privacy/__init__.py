"""Privacy layer: additively homomorphic ciphers, fixed-point encoding, private set intersection.

:mod:`hyfl.privacy.audit` is a test tool: it finds private values in disguise
(copied, scaled, negated, offset, in fixed point) in what a party observed.
"""

# The cipher registry first: hyfl.privacy.lattice builds on it and is registered in it.
from hyfl.privacy import ciphers as _ciphers  # noqa: E402, F401
