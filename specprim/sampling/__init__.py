"""Sampling transforms (temperature, top-k, top-p) shared by target and draft, and ``sample`` (one token per row)."""

from specprim.sampling._impl import SamplingConfig, sample

__all__ = ["SamplingConfig", "sample"]
