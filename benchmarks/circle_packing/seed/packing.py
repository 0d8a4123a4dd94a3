"""Packs N circles into the unit square and writes their centres and radii to packing.json.

Centres start on rows, are spread by a penalty method (gradient steps with Adam on
centres and radii), and the final radii are the largest feasible ones for those centres,
found by a linear program. The harness checks the packing and computes the score. The
evolvable block holds the whole construction (``construct``); ``main`` only writes its result.
"""

import json
import sys

import numpy as np
from scipy.optimize import linprog

N = int(sys.argv[1]) if len(sys.argv) > 1 else 26

# EVOLVE-BLOCK-START
ROWS = [5, 5, 6, 5, 5]  # circles per row, bottom to top (must sum to N)
MARGIN = 0.1  # distance of the outer rows and columns from the walls
JITTER = 0.01  # random displacement of the starting centres
STEPS = 400  # gradient steps of the penalty method
LEARNING_RATE = 0.002
PENALTY = 20.0  # weight of overlap and wall violations
PENALTY_GROWTH = 1.005  # the penalty is multiplied by this every step
RNG_SEED = 1


def initial_centres(rng: np.random.Generator) -> np.ndarray:
    rows = list(ROWS)
    while sum(rows) < N:
        rows[len(rows) // 2] += 1
    while sum(rows) > N:
        rows[int(np.argmax(rows))] -= 1
    ys = np.linspace(MARGIN, 1 - MARGIN, len(rows))
    points = []
    for y, count in zip(ys, rows, strict=True):
        xs = np.linspace(MARGIN, 1 - MARGIN, count) if count > 1 else np.array([0.5])
        points += [(x, y) for x in xs]
    centres = np.array(points[:N], dtype=float)
    return np.clip(centres + rng.normal(0.0, JITTER, centres.shape), 0.01, 0.99)


def penalty_gradients(x: np.ndarray, r: np.ndarray, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of -sum(r) + weight * (squared overlaps + squared wall violations)."""
    diff = x[:, None, :] - x[None, :, :]
    dist = np.sqrt((diff**2).sum(-1) + np.eye(len(r)))
    overlap = np.triu(np.maximum(r[:, None] + r[None, :] - dist, 0.0), 1)
    overlap = overlap + overlap.T
    grad_r = -np.ones_like(r) + weight * 2 * overlap.sum(1)
    unit = diff / dist[..., None]
    grad_x = -weight * 2 * (overlap[..., None] * unit).sum(1)
    for axis in range(2):
        low = np.maximum(r - x[:, axis], 0.0)
        high = np.maximum(r + x[:, axis] - 1.0, 0.0)
        grad_r += weight * 2 * (low + high)
        grad_x[:, axis] += weight * 2 * (-low + high)
    return grad_x, grad_r


def optimise_centres(x: np.ndarray) -> np.ndarray:
    r = np.full(N, 0.5 / np.sqrt(N))
    params = [x, r]
    moments = [np.zeros_like(p) for p in params]
    squares = [np.zeros_like(p) for p in params]
    weight = PENALTY
    for step in range(1, STEPS + 1):
        grads = penalty_gradients(params[0], params[1], weight)
        for i, grad in enumerate(grads):
            moments[i] = 0.9 * moments[i] + 0.1 * grad
            squares[i] = 0.999 * squares[i] + 0.001 * grad**2
            m_hat = moments[i] / (1 - 0.9**step)
            v_hat = squares[i] / (1 - 0.999**step)
            params[i] = params[i] - LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-9)
        params[0] = np.clip(params[0], 0.0, 1.0)
        params[1] = np.maximum(params[1], 0.0)
        weight *= PENALTY_GROWTH
    return params[0]


def best_radii(x: np.ndarray) -> np.ndarray:
    """The largest radii for fixed centres: maximise sum(r) subject to no overlap, inside the square."""
    rows, bounds = [], []
    for i in range(N):
        for j in range(i + 1, N):
            row = np.zeros(N)
            row[i] = row[j] = 1.0
            rows.append(row)
            bounds.append(np.linalg.norm(x[i] - x[j]))
    walls = np.minimum(np.minimum(x[:, 0], 1 - x[:, 0]), np.minimum(x[:, 1], 1 - x[:, 1]))
    result = linprog(
        -np.ones(N),
        A_ub=np.array(rows),
        b_ub=np.array(bounds),
        bounds=list(zip(np.zeros(N), walls, strict=True)),
    )
    radii = result.x if result.success else np.zeros(N)
    return np.maximum(radii * (1 - 1e-9) - 1e-12, 0.0)  # stay strictly feasible in floating point


def construct() -> tuple[np.ndarray, np.ndarray]:
    """The packing: centres and radii of N circles."""
    rng = np.random.default_rng(RNG_SEED)
    centres = optimise_centres(initial_centres(rng))
    return centres, best_radii(centres)


# EVOLVE-BLOCK-END


def main() -> None:
    centres, radii = construct()
    with open("packing.json", "w") as out:
        json.dump({"centers": centres.tolist(), "radii": radii.tolist()}, out)


if __name__ == "__main__":
    main()
