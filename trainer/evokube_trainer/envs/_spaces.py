"""Action and observation spaces.

Spaces are static descriptions (hashable frozen dataclasses) so that an env holding one can be
closed over by a jitted function; they never hold JAX arrays.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Box:
    """A box of real vectors, ``low <= x <= high`` elementwise.

    ``low`` and ``high`` may be scalars or array-likes broadcastable to ``shape``; they are stored
    as read-only float32 numpy arrays of exactly ``shape``.
    """

    low: np.ndarray
    high: np.ndarray
    shape: tuple[int, ...]

    def __init__(self, low, high, shape):
        shape = tuple(int(d) for d in shape)
        low = np.broadcast_to(np.asarray(low, np.float32), shape).copy()
        high = np.broadcast_to(np.asarray(high, np.float32), shape).copy()
        if np.any(low > high):
            raise ValueError(f"Box needs low <= high, got low={low}, high={high}")
        low.setflags(write=False)
        high.setflags(write=False)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "shape", shape)

    @property
    def size(self) -> int:
        """Number of scalars in one element of the space."""
        return math.prod(self.shape)

    def _key(self) -> tuple:
        return (self.shape, tuple(self.low.ravel().tolist()), tuple(self.high.ravel().tolist()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Box(low={self.low.tolist()}, high={self.high.tolist()}, shape={self.shape})"


@dataclasses.dataclass(frozen=True)
class Discrete:
    """The integers ``0 .. n-1``."""

    n: int

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"Discrete needs n >= 1, got {self.n}")

    @property
    def shape(self) -> tuple[int, ...]:
        return ()


Space = Box | Discrete


def action_dim(space: Space) -> int:
    """Length of the action vector a policy emits for ``space``.

    A Box takes its flattened size; a Discrete space of ``n`` actions takes ``n`` scores (the env
    picks the argmax, see the package docstring).
    """
    return space.size if isinstance(space, Box) else space.n
