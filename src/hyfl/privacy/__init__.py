"""Privacy layer: additively homomorphic ciphers, fixed-point encoding, private set intersection."""
