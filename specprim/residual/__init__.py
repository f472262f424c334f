"""What to sample after a rejection: ``residual(p, q) = normalize(max(0, p - q))``."""

from specprim.residual._impl import residual

__all__ = ["residual"]
