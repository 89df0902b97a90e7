"""Padding sizes (internal API, not part of the public interface): arrays padded to bucket sizes share one compiled
program per bucket instead of one per size (the scikit-learn estimators' designs, the multiclass classifier's
test points)."""


def bucket(n: int, minimum: int = 16, steps: int = 1) -> int:
    """The padded size for n.

    Args:
        n: a size.
        minimum: the smallest padded size (a power of two).
        steps: sizes per octave: 1 gives powers of two; 4 gives 2^k (1, 1.25, 1.5, 1.75), at most 25% padding.

    Returns:
        int, the smallest such size >= max(n, minimum).
    """
    n = max(int(n), int(minimum))
    octave = 1 << max(n - 1, 0).bit_length() >> 1            # the largest power of two below n (n > 1)
    if octave == 0 or steps <= 1 or octave * 2 == n:
        return int(max(minimum, 1 << max(n - 1, 0).bit_length()))
    step = max(octave // steps, 1)
    return int(-(-n // step) * step)
