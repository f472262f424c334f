"""Sampling transforms (temperature, top-k, top-p) shared by target and draft, ``sample`` (one token per row) and
``argmax`` (the first maximal index of every row)."""

from specprim.sampling._impl import SamplingConfig, argmax, sample

__all__ = ["SamplingConfig", "argmax", "sample"]
