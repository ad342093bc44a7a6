"""Neural hybrid FL (optional extra): HyFEM and FedBCD with neural models."""
