"""Sampling transforms (temperature, top-k, top-p) shared by target and draft."""

from specprim.sampling._impl import SamplingConfig

__all__ = ["SamplingConfig"]
